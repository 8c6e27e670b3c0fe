"""Submission, validation, isolation between users, cancellation of queued jobs."""

from caldera.db.models import Job, JobEventRow

BATCH = {"name": "hello", "command": "echo hi"}


def test_submit_and_describe(api, admin):
    r = api.client.post("/api/v1/jobs", json={**BATCH, "resources": {"gpu": 1}}, headers=admin)
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["state"] == "Queued" and job["account"] == "default" and job["queue"] == "default"
    d = api.client.get(f"/api/v1/jobs/{job['id']}", headers=admin).json()
    assert [(e["from"], e["to"], e["reason"]) for e in d["events"]] == [
        (None, "Pending", "Submitted"),
        ("Pending", "Queued", "Admitted"),
    ]
    assert all(e["at"] > 0 for e in d["events"])


def test_bad_specs_are_400_naming_the_field_and_create_nothing(api, admin, platform):
    cases = [
        ({**BATCH, "unknown": 1}, "unknown"),
        ({**BATCH, "resources": {"gpu": -2}}, "resources.gpu"),
        ({**BATCH, "resources": {"gpu": 5}}, "resources"),  # the node has 4
        ({**BATCH, "resources": {"gpu": 1, "gpu_model": "h100"}}, "resources"),
        ({**BATCH, "account": "nope"}, "account"),
        ({**BATCH, "queue": "nope"}, "queue"),
    ]
    for body, field in cases:
        r = api.client.post("/api/v1/jobs", json=body, headers=admin)
        assert r.status_code == 400, (body, r.text)
        assert field in [e["field"] for e in r.json()["errors"]], (body, r.json())
    with platform.session() as db:
        assert db.query(Job).count() == 0 and db.query(JobEventRow).count() == 0


def test_member_only_accounts(api, admin):
    api.client.post("/api/v1/accounts", json={"name": "vision"}, headers=admin)
    bob = api.user(admin, "bob")
    r = api.client.post("/api/v1/jobs", json={**BATCH, "account": "vision"}, headers=bob)
    assert r.status_code == 400 and r.json()["errors"][0]["field"] == "account"
    assert (
        api.client.post("/api/v1/accounts/vision/members", json={"username": "bob"}, headers=admin).status_code == 201
    )
    r = api.client.post("/api/v1/jobs", json={**BATCH, "account": "vision"}, headers=bob)
    assert r.status_code == 201 and r.json()["queue"] == "vision"


def test_users_never_see_or_touch_each_others_jobs(api, admin):
    alice, bob = api.user(admin, "alice"), api.user(admin, "bob")
    ja = api.client.post("/api/v1/jobs", json=BATCH, headers=alice).json()["id"]
    jb = api.client.post("/api/v1/jobs", json=BATCH, headers=bob).json()["id"]
    assert [j["id"] for j in api.client.get("/api/v1/jobs", headers=alice).json()] == [ja]
    assert [j["id"] for j in api.client.get("/api/v1/jobs?all=true", headers=alice).json()] == [ja]
    for path in (
        f"/api/v1/jobs/{jb}",
        f"/api/v1/jobs/{jb}/events",
        f"/api/v1/jobs/{jb}/why",
        f"/api/v1/jobs/{jb}/logs",
    ):
        assert api.client.get(path, headers=alice).status_code == 404, path
    assert api.client.post(f"/api/v1/jobs/{jb}/cancel", headers=alice).status_code == 404
    assert api.client.get(f"/api/v1/jobs/{jb}", headers=bob).json()["state"] == "Queued"
    # admins see everyone's
    assert {j["id"] for j in api.client.get("/api/v1/jobs?all=true", headers=admin).json()} == {ja, jb}


def test_cancel_a_queued_job(api, admin):
    jid = api.client.post("/api/v1/jobs", json=BATCH, headers=admin).json()["id"]
    r = api.client.post(f"/api/v1/jobs/{jid}/cancel", headers=admin)
    assert r.json()["state"] == "Cancelled"
    events = api.client.get(f"/api/v1/jobs/{jid}/events", headers=admin).json()
    assert events[-1]["reason"] == "CancelledByUser" and "admin" in events[-1]["message"]
    # idempotent
    assert api.client.post(f"/api/v1/jobs/{jid}/cancel", headers=admin).json()["state"] == "Cancelled"


def test_nodes_show_idle_gpus(api, admin):
    nodes = api.client.get("/api/v1/nodes", headers=admin).json()
    assert nodes[0]["name"] == "node-0" and [g["model"] for g in nodes[0]["gpus"]] == ["a100"] * 4
    assert all(g["job"] is None for g in nodes[0]["gpus"])
