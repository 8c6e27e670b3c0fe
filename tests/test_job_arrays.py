"""Job arrays through the API with real processes: one submission makes N tasks, each a job with its index in its
environment; ``%N`` keeps at most N running (seen by the loop at every cycle and in the tasks' own clocks), a task
over the limit says why (in English and Chinese); cancel, hold and release act on the whole array or on one task;
``--after`` an array waits for every task; the size limit and the expression's syntax are checked. Then the CLI on
the SDK against a real server: submit --array, ls groups the tasks, describe, ARRAY_INDEX, cancel of the array."""

from __future__ import annotations

import json

import pytest

from caldera.core.arrays import parse_array
from caldera.server.web import i18n
from caldera.server.web.reason_text import Say
from tests.conftest import wait_for
from tests.test_cli_sdk import sdk  # noqa: F401 - the fixture
from tests.test_runs import _log, _state, _submit, _until
from tests.test_server_process import cli, token, until

SQLITE = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
TINY = {"cpu": 0.1, "memory_mib": 64}
ZH = Say(i18n.translations("zh").gettext)
ACTIVE = ("Starting", "Running")


def _array(api, h, expression, **spec) -> dict:
    r = api.client.post("/api/v1/arrays", json={"spec": {"resources": TINY, **spec}, "array": expression}, headers=h)
    assert r.status_code == 201, r.text
    return r.json()


def _get(api, h, array_id) -> dict:
    return api.client.get(f"/api/v1/arrays/{array_id}", headers=h).json()


def test_the_expression_names_indices_steps_and_a_limit():
    assert parse_array("0-3%2", 10).indices == (0, 1, 2, 3) and parse_array("0-3%2", 10).max_running == 2
    assert parse_array("7,1,3-9:3", 10).indices == (1, 3, 6, 7, 9)
    assert parse_array("5", 10).max_running is None
    for bad in ("", "a-b", "3-1", "0-4:0", "0-3%0", "0-10", "1,,2", "0-2000000"):
        with pytest.raises(ValueError):
            parse_array(bad, 10)


@SQLITE
def test_at_most_n_tasks_run_at_once_and_each_knows_its_index(api, admin):
    alice = api.user(admin, "alice")
    script = "echo $CALDERA_ARRAY_ID $CALDERA_ARRAY_INDEX; date +%s.%N; sleep 0.4; date +%s.%N"
    a = _array(api, alice, "0-4%2", name="sweep", command=["sh", "-c", script])
    assert (a["size"], a["max_running"], a["state"]) == (5, 2, "Queued")
    assert [t["index"] for t in a["tasks"]] == [0, 1, 2, 3, 4]
    loop, seen = api.client.app.state.loop, []

    def ended():
        loop.tick()
        now = _get(api, alice, a["id"])
        seen.append(sum(now["counts"].get(s, 0) for s in ACTIVE))
        return now if now["state"] == "Succeeded" else None

    done = wait_for(ended, 90, what="every task")
    assert max(seen) == 2  # the limit was reached and never passed
    spans = []
    for t in done["tasks"]:
        ids, start, end = _log(api, alice, t["id"]).split("\n")[:3]
        assert ids == f"{a['id']} {t['index']}"
        spans.append((float(start), float(end)))
    overlaps = [sum(1 for s, e in spans if s <= start < e) for start, _ in spans]
    assert max(overlaps) <= 2  # the processes' own clocks agree

    job = _state(api, alice, done["tasks"][0]["id"])
    assert (job["array_id"], job["array_index"]) == (a["id"], 0)


@SQLITE
def test_a_task_over_the_limit_says_why(api, admin):
    alice = api.user(admin, "alice")
    a = _array(api, alice, "0-2%1", name="one-at-a-time", command=["sleep", "30"])
    first, second = a["tasks"][0]["id"], a["tasks"][1]["id"]
    _until(api, alice, first, set(ACTIVE))
    api.client.app.state.loop.tick()
    reasons = api.client.get(f"/api/v1/jobs/{second}/why", headers=alice).json()["pending"]
    assert [(r["code"], r["message"]) for r in reasons] == [
        ("ArrayLimit", f"array {a['id']} already runs 1 tasks, its limit (%1)")
    ]
    assert ZH.pending(reasons[0]) == f"作业数组 {a['id']} 已有 1 个任务在运行，达到其上限（%1）"
    assert api.client.post(f"/api/v1/arrays/{a['id']}/cancel", headers=alice).status_code == 200


@SQLITE
def test_cancel_hold_and_release_act_on_the_whole_array_or_one_task(api, admin):
    alice, bob = api.user(admin, "alice"), api.user(admin, "bob")
    c = api.client
    a = _array(api, alice, "0-3", name="held", command=["sleep", "30"])
    assert c.post(f"/api/v1/arrays/{a['id']}/hold", headers=bob).status_code == 404  # not bob's
    held = c.post(f"/api/v1/arrays/{a['id']}/hold", json={"reason": "data"}, headers=alice).json()
    assert all(_state(api, alice, t["id"])["hold"]["note"] == "data" for t in held["tasks"])
    for _ in range(2):
        c.app.state.loop.tick()
    assert _get(api, alice, a["id"])["counts"] == {"Queued": 4}  # none offered to the scheduler

    one = a["tasks"][2]["id"]
    assert c.post(f"/api/v1/jobs/{one}/release", headers=alice).status_code == 200  # a task is a job
    _until(api, alice, one, set(ACTIVE))
    assert c.post(f"/api/v1/arrays/{a['id']}/release", headers=alice).status_code == 200
    for t in a["tasks"]:
        _until(api, alice, t["id"], set(ACTIVE))

    r = c.post(f"/api/v1/jobs/{a['tasks'][0]['id']}/cancel", headers=alice)
    assert r.status_code == 200 and _until(api, alice, a["tasks"][0]["id"], {"Cancelled"})
    assert c.post(f"/api/v1/arrays/{a['id']}/cancel", headers=alice).status_code == 200
    for t in a["tasks"]:
        _until(api, alice, t["id"], {"Cancelled"})
    assert _get(api, alice, a["id"])["state"] == "Cancelled"
    assert c.get(f"/api/v1/arrays/{a['id']}", headers=bob).status_code == 404
    [listed] = c.get("/api/v1/arrays", headers=alice).json()
    assert listed["id"] == a["id"] and listed["counts"] == {"Cancelled": 4} and "tasks" not in listed  # counts only
    assert (listed["account"], listed["queue"]) == (a["account"], a["queue"]) and listed["user"] == "alice"
    assert c.get("/api/v1/arrays", headers=bob).json() == []


@SQLITE
def test_after_an_array_waits_for_every_task_and_fails_with_any_of_them(api, admin):
    a = _array(api, admin, "0-1", name="fast-and-slow", command=["sh", "-c", "sleep $((CALDERA_ARRAY_INDEX * 2))"])
    after = _submit(api, admin, name="gather", command=["true"], resources=TINY, after=[{"job": a["id"]}])
    _until(api, admin, a["tasks"][0]["id"], {"Succeeded"})
    api.client.app.state.loop.tick()
    reasons = api.client.get(f"/api/v1/jobs/{after}/why", headers=admin).json()["pending"]
    assert reasons[0]["code"] == "Dependency" and a["id"] in reasons[0]["message"]
    done = _until(api, admin, after, {"Succeeded"})
    assert done["started_at"] >= _state(api, admin, a["tasks"][1]["id"])["finished_at"]

    failing = _array(api, admin, "0-1", name="one-fails", command=["sh", "-c", "exit $CALDERA_ARRAY_INDEX"])
    needs_ok = _submit(api, admin, name="never", command=["true"], resources=TINY, after=[{"job": failing["id"]}])
    assert _until(api, admin, needs_ok, {"Cancelled"})["reason"] == "DependencyFailed"


@SQLITE
def test_the_size_limit_and_the_syntax_are_checked_before_any_task_exists(api, admin):
    c = api.client
    c.app.state.platform.settings.max_array_size = 3
    body = {"spec": {"name": "x", "command": ["true"], "resources": TINY}}
    for expression, code in (("0-3", "BadArray"), ("0-2%0", "BadArray"), ("zero", "BadArray")):
        r = c.post("/api/v1/arrays", json={**body, "array": expression}, headers=admin)
        assert r.status_code == 400 and r.json()["errors"][0]["code"] == code, r.text
    r = c.post("/api/v1/arrays", json={**body, "array": "0-" + "9" * 300}, headers=admin)
    assert r.status_code in (400, 422)
    r = c.post("/api/v1/arrays", json={"spec": {**body["spec"], "queue": "nope"}, "array": "0-1"}, headers=admin)
    assert r.status_code == 400 and r.json()["errors"][0]["code"] == "UnknownQueue"  # the spec's own checks
    assert c.get("/api/v1/arrays", headers=admin).json() == [] and c.get("/api/v1/jobs", headers=admin).json() == []


@SQLITE
def test_cli_submit_array_ls_describe_task_and_cancel(server, sdk, tmp_path):  # noqa: F811 - the fixture
    spec = tmp_path / "sweep.yaml"
    spec.write_text("name: sweep\ncommand: sleep 60\nresources: {cpu: 0.1, memory_mib: 64}\n")
    out = cli(server, "submit", str(spec), "--array", "0-5:1%2").stdout
    assert "6 tasks, at most 2 running at once" in out, out
    array_id = out.split("job array ")[1].split()[0]
    h = token(server)
    tasks = sdk.array(array_id)["tasks"]
    assert until(server, h, tasks[1]["id"], set(ACTIVE))

    listed = cli(server, "ls").stdout  # one row for the array, its tasks counted
    assert array_id in listed and "sweep[6 tasks]" in listed and tasks[0]["id"] not in listed
    assert "4 Queued" in listed
    described = cli(server, "describe", array_id[:7]).stdout  # a prefix of the array's id
    assert "job array 0-5:1%2 (6 tasks, at most 2 running)" in described and tasks[5]["id"] in described
    task = json.loads(cli(server, "describe", f"{array_id}_3", "-o", "json").stdout)
    assert (task["id"], task["array_index"]) == (tasks[3]["id"], 3)

    cancelled = cli(server, "cancel", array_id).stdout
    assert f"{array_id}: job array" in cancelled
    for t in tasks:
        assert until(server, h, t["id"], {"Cancelled"})
    assert sdk.wait(array_id, timeout=10)["state"] == "Cancelled"
    bad = cli(server, "run", "--array", "0-99999", "--", "true", check=False)
    assert bad.returncode == 1 and "max_array_size" in bad.stderr


@SQLITE
def test_a_users_cap_on_running_jobs_counts_each_task(api, admin):
    c = api.client
    caps = {"account": "default", "user_caps": {"max_running_jobs": 1}}
    assert c.put("/api/v1/queues/default", json=caps, headers=admin).status_code == 200
    a = _array(api, admin, "0-2%2", name="capped", command=["sleep", "30"])  # its own limit is higher
    loop = c.app.state.loop
    wait_for(lambda: loop.tick() or _get(api, admin, a["id"])["state"] == "Running", 60, what="a task to start")
    for _ in range(3):
        c.app.state.loop.tick()
        now = _get(api, admin, a["id"])
        assert sum(now["counts"].get(s, 0) for s in ACTIVE) == 1, now
    queued = [t["id"] for t in now["tasks"] if t["state"] == "Queued"]
    waiting = c.get(f"/api/v1/jobs/{queued[0]}/why", headers=admin).json()["pending"]
    assert waiting and waiting[0]["code"] != "ArrayLimit"  # the scheduler's cap, not the array's limit
    c.post(f"/api/v1/arrays/{a['id']}/cancel", headers=admin)


@SQLITE
def test_an_array_tells_its_user_once_when_its_last_task_ends(api, admin):
    alice = api.user(admin, "alice")
    a = _array(api, alice, "0-2", name="told", command=["sh", "-c", "exit $((CALDERA_ARRAY_INDEX == 1))"])
    for t in a["tasks"]:
        _until(api, alice, t["id"], {"Succeeded", "Failed"})
    items = api.client.get("/api/v1/notifications", headers=alice).json()["items"]
    assert [(n["subject"], n["body"]) for n in items] == [
        ("Job told[3 tasks] failed", "Your job told[3 tasks] failed: 2 Succeeded, 1 Failed")
    ]
    # the last task to end is cancelled: the array, which had a failure, is told of still
    b = _array(api, alice, "0-1", name="cut", command=["sh", "-c", "[ $CALDERA_ARRAY_INDEX = 0 ] && exit 1; sleep 60"])
    _until(api, alice, b["tasks"][0]["id"], {"Failed"})
    assert api.client.post(f"/api/v1/jobs/{b['tasks'][1]['id']}/cancel", headers=alice).is_success
    _until(api, alice, b["tasks"][1]["id"], {"Cancelled"})
    items = api.client.get("/api/v1/notifications", headers=alice).json()["items"]
    assert ("Job cut[2 tasks] failed", "Your job cut[2 tasks] failed: 1 Failed, 1 Cancelled") in [
        (n["subject"], n["body"]) for n in items
    ]


@SQLITE
def test_new_ids_are_drawn_in_batches_and_never_take_a_jobs_or_an_arrays_id(api, admin, monkeypatch):
    from caldera.server import jobs

    alice = api.user(admin, "alice")
    a = _array(api, alice, "0-1", name="taken", command=["true"])
    taken = [a["id"], a["tasks"][0]["id"]]
    draws = iter([*taken, "aaaaaaaaaa", taken[1], "bbbbbbbbbb", "cccccccccc"])
    monkeypatch.setattr(jobs.secrets, "token_hex", lambda n: next(draws))
    with api.client.app.state.platform.session() as db:
        assert sorted(jobs.new_ids(db, 3)) == ["aaaaaaaaaa", "bbbbbbbbbb", "cccccccccc"]


@SQLITE
def test_the_portal_lists_an_array_as_one_row_and_its_page_lists_counts_and_acts_on_every_task(api, admin):
    from tests.portal import browser_for, post_form

    alice = api.user(admin, "alice")
    api.user(admin, "bob")
    a = _array(api, alice, "0-2", name="sweep", command=["true"])
    solo = {"name": "solo", "command": ["true"], "resources": TINY}
    single = api.client.post("/api/v1/jobs", json=solo, headers=alice)
    first = a["tasks"][0]["id"]
    assert api.client.post(f"/api/v1/jobs/{first}/cancel", headers=alice).status_code == 200
    me = browser_for(api.client, "alice", "password-123")
    rows = me.get("/jobs").text
    assert rows.count(f'data-array="{a["id"]}"') == 1 and single.json()["id"] in rows
    assert not any(f'href="/jobs/{t["id"]}"' in rows for t in a["tasks"])  # the tasks are behind the array's row
    assert "array of 3 tasks" in rows and "1 Cancelled · 2 Queued" in rows
    for state in ("Cancelled", "Queued"):  # the row stands for whichever of its tasks the filter keeps
        assert f'href="/arrays/{a["id"]}"' in me.get(f"/jobs?state={state}").text
    assert "作业数组，3 个任务" in me.get("/jobs", headers={"Accept-Language": "zh"}).text

    page = me.get(f"/arrays/{a['id']}?state=Queued").text
    assert 'data-index="1"' in page and 'data-index="2"' in page and 'data-index="0"' not in page
    assert post_form(me, f"/arrays/{a['id']}/hold", {}).status_code == 303
    held = [api.client.get(f"/api/v1/jobs/{t['id']}", headers=alice).json()["hold"] for t in a["tasks"][1:]]
    assert all(h and h["by"] == "alice" for h in held)
    assert f'id="array-link">task 1 of array {a["id"]}' in me.get(f"/jobs/{a['tasks'][1]['id']}").text

    bob = browser_for(api.client, "bob", "password-123")
    assert bob.get(f"/arrays/{a['id']}").status_code == 404 and a["id"] not in bob.get("/jobs").text
    assert post_form(bob, f"/arrays/{a['id']}/cancel", {}).status_code == 404
    assert _get(api, alice, a["id"])["counts"]["Queued"] == 2  # bob's cancel did nothing
