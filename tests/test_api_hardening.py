"""Inputs an attacker (or a careless script) sends: huge and malformed specs, unknown filters, absurd log offsets,
priorities nobody granted, jobs no cap would ever let start."""

from typing import Annotated

from caldera.core.spec import MAX_COMMAND_CHARS, MAX_ENV_ENTRIES, MAX_ENV_VALUE_CHARS
from caldera.db.models import Job
from caldera.server.params import DB_INT_MAX, INT64_MAX
from tests.routes import api_routes
from tests.test_runs import _submit, _until

BATCH = {"name": "hello", "command": "echo hi"}


def _refused(api, headers, body, field, status=400):
    r = api.client.post("/api/v1/jobs", json=body, headers=headers)
    assert r.status_code == status, (str(body)[:200], r.text[:500])
    assert field in [e["field"] for e in r.json().get("errors", [])] or status != 400, r.json()
    return r.json()


def test_spec_size_limits(api, admin, platform):
    huge = "x" * (MAX_COMMAND_CHARS + 1)
    _refused(api, admin, {**BATCH, "command": huge}, "command")
    _refused(api, admin, {**BATCH, "command": ["echo", huge]}, "command.1")
    _refused(api, admin, {**BATCH, "command": ["x" * 40000, "y" * 40000]}, "command")  # together
    _refused(api, admin, {**BATCH, "command": ["a"] * 1025}, "command")
    _refused(api, admin, {**BATCH, "env": {"BIG": "v" * (MAX_ENV_VALUE_CHARS + 1)}}, "env.BIG")
    _refused(api, admin, {**BATCH, "env": {f"V{i}": "1" for i in range(MAX_ENV_ENTRIES + 1)}}, "env")
    _refused(api, admin, {**BATCH, "env": {"A" * 300: "1"}}, "env." + "A" * 61 + "....[key]")  # not echoed whole
    _refused(api, admin, {**BATCH, "name": "n" * 129}, "name")
    _refused(api, admin, {**BATCH, "account": "a" * 65}, "account")
    _refused(api, admin, {**BATCH, "queue": "q" * 65}, "queue")
    _refused(api, admin, {**BATCH, "command": ["echo", "a\0b"]}, "command")
    _refused(api, admin, {**BATCH, "env": {"X": "a\0b"}}, "env")
    _refused(api, admin, {**BATCH, "command": "echo 'unclosed"}, "command")
    with platform.session() as db:
        assert db.query(Job).count() == 0
    # at the limits it is accepted
    ok = {**BATCH, "env": {f"V{i}": "v" * 100 for i in range(MAX_ENV_ENTRIES)}, "command": ["echo", "x" * 60000]}
    assert api.client.post("/api/v1/jobs", json=ok, headers=admin).status_code == 201


def test_booleans_are_not_numbers(api, admin):
    for body, field in (
        ({**BATCH, "resources": {"gpu": True}}, "resources"),
        ({**BATCH, "resources": {"cpu": False}}, "resources"),
        ({**BATCH, "max_runtime_s": True}, "max_runtime_s"),
        ({"name": "d", "kind": "distributed", "command": "true", "replicas": True}, "replicas"),
    ):
        out = _refused(api, admin, body, field)
        assert any(w in e["reason"] for e in out["errors"] for w in ("integer", "number")), out
    r = api.client.put(
        "/api/v1/queues/default", json={"account": "default", "user_caps": {"max_gpus": True}}, headers=admin
    )
    assert r.status_code == 400 and r.json()["errors"][0]["field"] == "user_caps.max_gpus"


def test_fields_that_do_not_apply_to_a_kind_are_refused(api, admin):
    out = _refused(api, admin, {"name": "lab", "kind": "jupyter", "command": "rm -rf ~"}, "command")
    assert "jupyter" in out["detail"]
    _refused(api, admin, {**BATCH, "replicas": 2}, "body")
    assert api.client.post("/api/v1/jobs", json={"name": "lab", "kind": "jupyter"}, headers=admin).status_code == 201


def test_workdir_stays_in_the_users_space(api, admin):
    for wd in ("/", "/etc", str(api.client.app.state.platform.settings.data_dir), "..", "a/../../b", "~root", "a/.."):
        out = _refused(api, admin, {**BATCH, "workdir": wd}, "workdir")
        assert "workspace" in out["detail"], out
    jid = _submit(api, admin, **BATCH, workdir="projects/one")
    home = api.client.app.state.platform.settings.workspaces / "admin"
    j = _until(api, admin, jid, {"Succeeded", "Failed"})
    assert j["state"] == "Succeeded", j
    assert (home / "projects" / "one").is_dir()


def test_unknown_state_filters_are_400_listing_the_valid_ones(api, admin):
    _submit(api, admin, **BATCH)
    r = api.client.get("/api/v1/jobs?state=Queued&state=running", headers=admin)
    assert r.status_code == 400
    assert "'running'" in r.json()["detail"] and "Queued" in r.json()["detail"] and "Succeeded" in r.json()["detail"]
    assert len(api.client.get("/api/v1/jobs?state=Queued", headers=admin).json()) == 1


def test_log_offsets_past_the_end_give_nothing(api, admin):
    jid = _submit(api, admin, name="talk", command=["echo", "hello log"])
    _until(api, admin, jid, {"Succeeded"})
    base = f"/api/v1/jobs/{jid}/logs"
    assert api.client.get(base, headers=admin).text == "hello log\n"
    assert api.client.get(base + "?offset=6", headers=admin).text == "log\n"
    for offset in (10, 10**6, INT64_MAX):
        r = api.client.get(f"{base}?offset={offset}", headers=admin)
        assert r.status_code == 200 and r.text == "", offset
        r = api.client.get(f"{base}?offset={offset}&follow=true", headers=admin)
        assert r.status_code == 200 and r.text == "", offset
    for offset in (INT64_MAX + 1, 10**40):  # past any integer a store holds: the one rule for every integer
        assert api.client.get(f"{base}?offset={offset}", headers=admin).status_code == 400, offset
    assert api.client.get(f"{base}?offset=-1", headers=admin).status_code == 400
    assert api.client.get(f"{base}?rank={10**30}", headers=admin).status_code == 400


def test_priority_above_normal_needs_a_grant(api, admin):
    alice = api.user(admin, "alice")
    bob = api.user(admin, "bob")
    r = api.client.post("/api/v1/jobs", json={**BATCH, "priority": "high"}, headers=alice)
    assert r.status_code == 403
    assert "grant" in r.json()["detail"] and "caldera queue grant default alice high" in r.json()["detail"]
    for cls in ("normal", "low", "best-effort"):
        assert api.client.post("/api/v1/jobs", json={**BATCH, "priority": cls}, headers=alice).status_code == 201
    assert (
        api.client.put("/api/v1/queues/default/grants/alice", json={"max_priority": "high"}, headers=bob).status_code
        == 403
    )
    r = api.client.put("/api/v1/queues/default/grants/alice", json={"max_priority": "high"}, headers=admin)
    assert r.status_code == 200 and r.json()["priority_grants"] == {"alice": "high"}
    assert api.client.post("/api/v1/jobs", json={**BATCH, "priority": "high"}, headers=alice).status_code == 201
    assert api.client.post("/api/v1/jobs", json={**BATCH, "priority": "high"}, headers=bob).status_code == 403
    # replacing the queue's quotas keeps the grants; a queue-wide grant lets everyone
    r = api.client.put("/api/v1/queues/default", json={"account": "default", "weight": 2}, headers=admin)
    assert r.json()["priority_grants"] == {"alice": "high"}
    r = api.client.put("/api/v1/queues/default", json={"account": "default", "max_priority": "high"}, headers=admin)
    assert r.status_code == 200
    assert api.client.post("/api/v1/jobs", json={**BATCH, "priority": "high"}, headers=bob).status_code == 201
    assert api.client.delete("/api/v1/queues/default/grants/alice", headers=admin).status_code == 200
    assert api.client.delete("/api/v1/queues/default/grants/alice", headers=admin).status_code == 404


def test_jobs_over_their_caps_are_refused_at_submission(api, admin):
    alice = api.user(admin, "alice")
    caps = {"account": "default", "user_caps": {"max_gpus": 2}, "quotas": {"cpu": {"capability": 8}}}
    assert api.client.put("/api/v1/queues/default", json=caps, headers=admin).status_code == 200
    out = _refused(api, alice, {**BATCH, "resources": {"gpu": 4}}, "resources")
    assert "caps each user at 2" in out["detail"] and "max_gpus" in out["detail"]
    out = _refused(api, alice, {**BATCH, "resources": {"cpu": 12}}, "resources")
    assert "capability for cpu" in out["detail"]
    out = _refused(
        api,
        alice,
        {"name": "d", "kind": "distributed", "command": "true", "replicas": 3, "resources": {"gpu": 1}},
        "resources",
    )
    assert "needs 3 GPUs" in out["detail"]
    caps["user_caps"] = {"max_interactive_jobs": 0}
    assert api.client.put("/api/v1/queues/default", json=caps, headers=admin).status_code == 200
    out = _refused(api, alice, {"name": "lab", "kind": "jupyter"}, "resources")
    assert "no interactive jobs" in out["detail"]


def test_why_names_the_user_cap_that_holds_a_job(api, admin):
    caps = {"account": "default", "user_caps": {"max_gpus": 2}}
    assert api.client.put("/api/v1/queues/default", json=caps, headers=admin).status_code == 200
    alice = api.user(admin, "alice")
    first = _submit(api, alice, name="a", command=["sleep", "30"], resources={"gpu": 2})
    _until(api, alice, first, {"Running"})
    second = _submit(api, alice, name="b", command=["true"], resources={"gpu": 1})
    api.client.app.state.loop.tick()
    why = api.client.get(f"/api/v1/jobs/{second}/why", headers=alice).json()
    cap = next(p for p in why["pending"] if p["code"] == "UserCap")
    assert cap["details"]["cap"] == "max_gpus" and "user cap of 2 GPUs" in cap["message"], why
    api.client.post(f"/api/v1/jobs/{first}/cancel", headers=alice)
    _until(api, alice, first, {"Cancelled"})


def test_values_the_database_cannot_hold_are_400(api, admin):
    """NUL characters (PostgreSQL text refuses them) and integers past a column's range: bad input, not 500."""
    for method, path, body in (
        ("POST", "/api/v1/auth/login", {"username": "a\0", "password": "password"}),
        ("GET", "/api/v1/jobs/a%00b", None),
        ("GET", "/api/v1/queues/a%00b", None),
        ("POST", "/api/v1/tokens", {"name": "a\0"}),
        ("POST", "/api/v1/accounts", {"name": "abc", "description": "x\0"}),
        ("PUT", "/api/v1/queues/default/grants/a%00", {"max_priority": "high"}),
        ("DELETE", "/api/v1/tokens/99999999999", None),
    ):
        r = api.client.request(method, path, json=body, headers=admin)
        assert r.status_code in (201, 400, 401, 404), (method, path, r.status_code, r.text)


def _integer_parameters(app):
    """(route, name, json schema) of every integer path and query parameter of every route, pages included."""
    from pydantic import TypeAdapter

    def params(dependant):  # the route's own parameters and those its dependencies read, at any depth
        yield from (*dependant.path_params, *dependant.query_params)
        for sub in dependant.dependencies:
            yield from params(sub)

    for route in api_routes(app):
        for param in params(route.dependant):
            info = param.field_info
            annotated = Annotated[info.annotation, *info.metadata] if info.metadata else info.annotation
            schema = TypeAdapter(annotated).json_schema()
            for option in schema.get("anyOf", [schema]):
                if option.get("type") == "integer":
                    yield f"{sorted(route.methods or ['WEBSOCKET'])} {route.path}", param.name, option


def test_every_integer_parameter_of_every_route_is_bounded(api):
    """The class of 500s that template ids past 2**63 were (SQLite's OverflowError): read off the route table, so a
    route added later without bounds fails here; then each is called just past its bound."""
    found = list(_integer_parameters(api.client.app))
    assert len(found) >= 10, found  # the table was read: ids of tokens, keys, templates; offsets, limits, ranks
    for route, name, schema in found:
        assert "minimum" in schema and "maximum" in schema, (route, name, schema)
        assert schema["minimum"] >= -INT64_MAX and schema["maximum"] <= INT64_MAX, (route, name, schema)


def test_ids_past_the_databases_range_are_400_not_500(api, admin):
    api.client.post("/api/v1/templates", json={"name": "t", "spec": BATCH}, headers=admin)
    tid = api.client.get("/api/v1/templates", headers=admin).json()[0]["id"]
    for huge in (DB_INT_MAX + 1, 2**63, 2**64 + 1, 10**40):
        for method, path, body in (
            ("GET", f"/api/v1/templates/{huge}", None),
            ("PUT", f"/api/v1/templates/{huge}/share", {"account": None}),
            ("DELETE", f"/api/v1/templates/{huge}", None),
            ("DELETE", f"/api/v1/tokens/{huge}", None),
            ("DELETE", f"/api/v1/ssh-keys/{huge}", None),
        ):
            r = api.client.request(method, path, json=body, headers=admin)
            assert r.status_code == 400, (method, path, r.status_code, r.text)
    assert api.client.get(f"/api/v1/templates/{tid}", headers=admin).status_code == 200  # the control
    assert api.client.get(f"/api/v1/templates/{DB_INT_MAX}", headers=admin).status_code == 404


def test_deep_or_aliased_yaml_is_refused_with_its_reason_not_a_500(api, admin):
    """The portal's "Import YAML" (and `caldera submit`'s parser, the same function): PyYAML composes recursively,
    so a deeply nested document was a RecursionError; aliases would expand to any size."""
    from caldera.core.spec import MAX_SPEC_YAML_DEPTH
    from tests.portal import browser_for, field_errors, post_form

    me = browser_for(api.client, "admin", "admin-password")
    deep = MAX_SPEC_YAML_DEPTH + 1
    cases = {
        "name: x\ncommand: 'true'\nenv: " + "[" * 60_000: "nested deeper than",
        "name: x\nsurprise: " + "{a: " * deep + "1" + "}" * deep: "nested deeper than",
        "name: x\nsurprise:\n" + "".join("  " * i + "- \n" for i in range(1, deep + 2)): "nested deeper than",
        "a: &a [x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\nname: x": "aliases",
    }
    for text, reason in cases.items():
        r = post_form(me, "/new/batch/import", {"yaml": text})
        assert r.status_code == 400, (text[:80], r.status_code)
        assert reason in " ".join(field_errors(r.text, "yaml")), text[:80]
    control = "name: x\ncommand: 'true'\nresources: {gpu: 1}\nenv: {A: '1'}\n"
    assert post_form(me, "/new/batch/import", {"yaml": control}).status_code == 200


def test_deeply_nested_json_bodies_are_4xx(api, admin):
    for depth in (100, 5_000, 300_000):
        deep = "[" * depth + "]" * depth
        for path, body in (
            ("/api/v1/templates", '{"name": "t", "spec": {"name": "x", "env": ' + deep + "}}"),
            ("/api/v1/jobs", '{"name": "x", "command": ' + deep + "}"),
            ("/api/v1/queues/default", '{"account": "default", "quotas": ' + deep + "}"),
        ):
            r = api.client.request(
                "PUT" if "queues" in path else "POST",
                path,
                content=body,
                headers={**admin, "Content-Type": "application/json"},
            )
            assert 400 <= r.status_code < 500, (path, depth, r.status_code, r.text[:200])
