"""Extend and lock requests through the API, over the fake runtime: who may ask and decide (owner, another user,
an account admin, an admin), what an approval changes for the governor (an extension moves the runtime limit, a
lock keeps an idle job from being warned until it expires), and the events, audit entries and notifications."""

from __future__ import annotations

import pytest

from caldera.core.governance import IdleRule
from caldera.db.models import Job
from caldera.server import tenancy
from tests.conftest import Api, make_settings
from tests.test_loop_fake_runtime import _api
from tests.test_runs import _submit, _until

HOUR = 3600


@pytest.fixture
def world(tmp_path):
    settings = make_settings(tmp_path, f"sqlite:///{tmp_path / 'caldera.db'}", run_jobs_as="server")
    api, _, client = _api(settings)
    admin = api.login("admin", "admin-password")
    for name in ("lab", "other"):
        assert api.client.post("/api/v1/accounts", json={"name": name}, headers=admin).status_code == 201
    people = {
        "owner": api.user(admin, "owner", accounts=["lab"]),
        "stranger": api.user(admin, "stranger", accounts=["lab"]),
        "boss": api.user(admin, "boss", accounts=["lab"]),
        "otherboss": api.user(admin, "otherboss", accounts=["other"]),
        "admin": admin,
    }
    for account, who in (("lab", "boss"), ("other", "otherboss")):
        r = api.client.put(f"/api/v1/accounts/{account}/admins/{who}", json={"admin": True}, headers=admin)
        assert r.status_code == 200, r.text
    platform = client.app.state.platform
    yield api, people, platform
    client.__exit__(None, None, None)


def _job(api: Api, who: dict, **kw) -> str:
    job = _submit(api, who, name="long", command=["sleep", "3600"], resources={"gpu": 1}, account="lab", **kw)
    _until(api, who, job, {"Running"})
    return job


def _ask(api, who, job, kind="extend", seconds=2 * HOUR, reason="one more epoch"):
    return api.client.post(f"/api/v1/jobs/{job}/requests", json={"kind": kind, "seconds": seconds, "reason": reason},
                           headers=who)  # fmt: skip


def _decide(api, who, request_id, approve=True, note=""):
    body = {"approve": approve, "note": note}
    return api.client.post(f"/api/v1/requests/{request_id}/decision", json=body, headers=who)


def _events(api, who, job) -> list[str]:
    return [e["reason"] for e in api.client.get(f"/api/v1/jobs/{job}/events", headers=who).json()]


def test_who_may_ask_and_who_may_decide(world):
    api, people, _ = world
    job = _job(api, people["owner"])
    assert _ask(api, people["stranger"], job).status_code == 404  # another user's job does not exist for them
    assert _ask(api, people["owner"], job, seconds=59).status_code == 400
    assert _ask(api, people["owner"], job, reason="x" * 501).status_code == 400
    r = _ask(api, people["owner"], job)
    assert r.status_code == 201, r.text
    req = r.json()
    assert (req["state"], req["kind"], req["user"]) == ("pending", "extend", "owner")
    assert _ask(api, people["owner"], job).status_code == 409  # one pending request of a kind at a time
    # the requester cannot decide; another member and another account's admin do not see it
    assert _decide(api, people["owner"], req["id"]).status_code == 403
    assert _decide(api, people["stranger"], req["id"]).status_code == 404
    assert _decide(api, people["otherboss"], req["id"]).status_code == 404
    assert [x["id"] for x in api.client.get("/api/v1/requests", headers=people["stranger"]).json()] == []
    assert [x["id"] for x in api.client.get("/api/v1/requests", headers=people["boss"]).json()] == [req["id"]]
    # the account's admin decides; a decided request stays decided
    r = _decide(api, people["boss"], req["id"])
    assert r.status_code == 200 and r.json()["state"] == "approved" and r.json()["decided_by"] == "boss"
    assert _decide(api, people["admin"], req["id"], approve=False).status_code == 409
    # a platform admin decides any request
    lock = _ask(api, people["owner"], job, kind="lock", seconds=HOUR).json()
    r = _decide(api, people["admin"], lock["id"], approve=False, note="not this week")
    assert r.json()["state"] == "declined" and r.json()["note"] == "not this week"
    assert _events(api, people["owner"], job)[-4:] == ["ExtendRequested", "ExtendApproved", "LockRequested",
                                                        "LockDeclined"]  # fmt: skip
    # only admins name account admins
    r = api.client.put("/api/v1/accounts/lab/admins/stranger", json={"admin": True}, headers=people["boss"])
    assert r.status_code == 403


def test_requests_and_decisions_are_told_and_audited(world):
    api, people, _ = world
    job = _job(api, people["owner"])
    req = _ask(api, people["owner"], job, reason="deadline friday").json()

    def told(who, event):
        return [n for n in api.client.get("/api/v1/notifications", headers=people[who]).json()["items"]
                if n["event"] == event and n["job_id"] == job]  # fmt: skip

    (asked,) = told("boss", "approval_requested")
    assert "owner" in asked["body"] and "deadline friday" in asked["body"]
    assert told("admin", "approval_requested") and not told("stranger", "approval_requested")
    assert not told("otherboss", "approval_requested")
    _decide(api, people["boss"], req["id"])
    (decided,) = told("owner", "approval_decided")
    assert "approved" in decided["body"]
    actions = [e["action"] for e in api.client.get("/api/v1/audit", headers=people["admin"]).json()["entries"]]
    assert {"governance.extend.request", "governance.decide", "account.admin"} <= set(actions)


def test_an_approved_extension_moves_the_runtime_limit(world):
    api, people, platform = world
    job = _job(api, people["owner"])
    governor = api.client.app.state.loop.governor
    with platform.session() as db:
        cfg = tenancy.all_queue_configs(db)["lab"]
        rules = cfg.governance.model_copy(update={"max_runtime_s": {"batch": HOUR}})
        started = db.get(Job, job).started_at
    req = _ask(api, people["owner"], job, seconds=2 * HOUR).json()
    _decide(api, people["boss"], req["id"])
    with platform.session() as db:
        governor.apply(db, {"lab": rules}, None, started + HOUR + 60)  # past the queue's limit, within the new
        db.commit()
        assert db.get(Job, job).stop_requested is None
        governor.apply(db, {"lab": rules}, None, started + 3 * HOUR + 1)
        db.commit()
        assert db.get(Job, job).stop_detail["reason"] == "RuntimeLimitReached"
    done = _until(api, people["owner"], job, {"Cancelled"})
    assert done["reason"] == "RuntimeLimitReached"
    assert "RuntimeLimitWarning" in _events(api, people["owner"], job)


def test_a_lock_keeps_an_idle_job_from_its_warning_until_it_expires(world):
    api, people, platform = world
    job = _job(api, people["owner"])
    governor = api.client.app.state.loop.governor
    rule = IdleRule(enabled=True, window_s=600, grace_s=60, stop=True)
    with platform.session() as db:
        rules = tenancy.all_queue_configs(db)["lab"].governance.model_copy(update={"idle_batch": rule})
        started = db.get(Job, job).started_at
    lock = _ask(api, people["owner"], job, kind="lock", seconds=HOUR, reason="debugging by hand").json()
    _decide(api, people["boss"], lock["id"])
    idle_until = started + 2 * HOUR
    samples = {job: {"node-0/0": [(started + t, 0.0) for t in range(0, 2 * HOUR + 1, 10)]}}
    with platform.session() as db:
        governor.apply(db, {"lab": rules}, samples, started + 1000)  # idle for the window, but locked
        db.commit()
    assert "IdleWarning" not in _events(api, people["owner"], job)
    with platform.session() as db:
        governor.apply(db, {"lab": rules}, samples, idle_until)  # the lock ran out an hour ago
        db.commit()
    reasons = _events(api, people["owner"], job)
    assert reasons.index("LockExpired") < reasons.index("IdleWarning")
    (expired,) = [r for r in api.client.get("/api/v1/requests", headers=people["owner"]).json() if r["kind"] == "lock"]
    assert expired["state"] == "expired"
    actions = [e["action"] for e in api.client.get("/api/v1/audit", headers=people["admin"]).json()["entries"]]
    assert "governance.expire" in actions


def test_a_job_on_a_cordoned_node_cannot_be_locked(world):
    api, people, _ = world
    job = _job(api, people["owner"])
    lock = _ask(api, people["owner"], job, kind="lock", seconds=HOUR).json()
    r = api.client.post("/api/v1/admin/nodes/node-0/cordon", json={"reason": "disk"}, headers=people["admin"])
    assert r.status_code == 200, r.text
    assert _decide(api, people["boss"], lock["id"]).status_code == 409  # cordoned since it was asked
    assert _ask(api, people["owner"], job, kind="extend").status_code == 201  # extending is still possible
    r = _decide(api, people["boss"], lock["id"], approve=False)
    assert r.status_code == 200
    assert _ask(api, people["owner"], job, kind="lock", seconds=HOUR).status_code == 409


def test_a_request_and_its_decision_are_told_in_chinese_words(world):
    """The action and the decision are codes rendered by the catalogue: a zh reader sees no English word of them."""
    api, people, _ = world
    for who in ("owner", "boss"):
        r = api.client.put("/api/v1/notifications/settings", json={"language": "zh"}, headers=people[who])
        assert r.status_code == 200, r.text
    job = _job(api, people["owner"])
    extend = _ask(api, people["owner"], job).json()
    lock = _ask(api, people["owner"], job, kind="lock", seconds=HOUR).json()
    _decide(api, people["boss"], extend["id"])
    _decide(api, people["boss"], lock["id"], approve=False)

    def told(who, event):
        items = api.client.get("/api/v1/notifications", headers=people[who]).json()["items"]
        return [f"{n['subject']} {n['body']}" for n in items if n["event"] == event and n["job_id"] == job]

    asked, decided = told("boss", "approval_requested"), told("owner", "approval_decided")
    assert len(asked) == 2 and len(decided) == 2
    for text in asked + decided:
        assert not any(word in text.lower() for word in ("extend", "lock", "approved", "declined")), text
    assert any("延长" in t for t in asked) and any("锁定" in t for t in asked)
    assert any("延长" in t and "已批准" in t for t in decided) and any("锁定" in t and "已拒绝" in t for t in decided)
    # an English reader still reads the words as they are
    with_en = told("admin", "approval_requested")
    assert any("asks to lock job" in t for t in with_en)
