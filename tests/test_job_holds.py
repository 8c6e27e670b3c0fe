"""Held jobs, an admin's requeue and dependencies (``after``), through the API with real processes: a held job is not
offered to the scheduler and says why (in English and Chinese), an admin's hold binds its owner, a requeue is a
preemption back to the queue, and a chain of jobs runs in order or is cancelled with its reason."""

from pathlib import Path

import pytest

from caldera.server.web import i18n
from caldera.server.web.reason_text import Say
from tests.conftest import wait_for
from tests.portal import browser_for
from tests.test_runs import _state, _submit, _until

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
TINY = {"cpu": 0.1, "memory_mib": 64}
ZH = Say(i18n.translations("zh").gettext)


def _why(api, h, jid) -> dict:
    return api.client.get(f"/api/v1/jobs/{jid}/why", headers=h).json()


def _events(api, h, jid) -> list[str]:
    return [e["reason"] for e in _state(api, h, jid)["events"]]


def test_a_held_job_waits_with_its_reason_until_released(api, admin):
    c, loop = api.client, api.client.app.state.loop
    alice = api.user(admin, "alice")
    bob = api.user(admin, "bob")
    jid = _submit(api, alice, name="later", command=["true"], resources=TINY)
    assert c.post(f"/api/v1/jobs/{jid}/hold", json={"reason": "data not ready"}, headers=bob).status_code == 404
    r = c.post(f"/api/v1/jobs/{jid}/hold", json={"reason": "data not ready"}, headers=alice)
    assert r.status_code == 200 and r.json()["hold"]["by"] == "alice", r.text
    for _ in range(3):
        loop.tick()
    assert _state(api, alice, jid)["state"] == "Queued"  # never offered to the scheduler
    reasons = _why(api, alice, jid)["pending"]
    assert [(r["code"], r["message"]) for r in reasons] == [("Held", "held by alice: data not ready")]
    assert ZH.pending(reasons[0]) == "已被 alice 挂起：data not ready"
    page = browser_for(c, "alice", "password-123")
    page.cookies.set(i18n.LANG_COOKIE, "zh")
    assert "已被 alice 挂起：data not ready" in page.get(f"/jobs/{jid}").text  # the portal says it too

    assert c.post(f"/api/v1/jobs/{jid}/release", headers=alice).status_code == 200
    assert _until(api, alice, jid, {"Succeeded"})
    assert {"Held", "Released"} <= set(_events(api, alice, jid))
    assert c.post(f"/api/v1/jobs/{jid}/hold", headers=alice).status_code == 409  # it has ended


def test_an_admins_hold_only_an_admin_releases(api, admin):
    c, loop = api.client, api.client.app.state.loop
    alice = api.user(admin, "alice")
    jid = _submit(api, alice, name="later", command=["true"], resources=TINY)
    assert c.post(f"/api/v1/jobs/{jid}/hold", headers=admin).status_code == 200
    r = c.post(f"/api/v1/jobs/{jid}/release", headers=alice)
    assert r.status_code == 403 and "admin" in r.json()["detail"]
    loop.tick()
    assert _why(api, alice, jid)["pending"][0]["code"] == "Held"
    assert c.post(f"/api/v1/jobs/{jid}/release", headers=admin).status_code == 200
    assert _until(api, alice, jid, {"Succeeded"})


def test_requeue_is_for_admins_and_puts_a_running_job_back(api, admin):
    c = api.client
    alice = api.user(admin, "alice")
    script = "trap 'cat \"$CALDERA_PREEMPT_NOTICE\" > notice-seen; exit 0' TERM; sleep 120 & wait"
    jid = _submit(api, alice, name="work", command=["sh", "-c", script], resources=TINY)
    _until(api, alice, jid, {"Running"})
    assert c.post(f"/api/v1/jobs/{jid}/requeue", json={"reason": "node swap"}, headers=alice).status_code == 403
    assert c.post(f"/api/v1/jobs/{jid}/requeue", json={"reason": "node swap"}, headers=admin).status_code == 200
    assert c.post(f"/api/v1/jobs/{jid}/requeue", headers=admin).status_code == 409  # already stopping

    def requeued():
        c.app.state.loop.tick()
        return "Requeued" in _events(api, alice, jid)

    wait_for(requeued, 60, what="the requeue")
    assert _until(api, alice, jid, {"Running"})["attempt"] == 2  # started again
    assert [r for r in _events(api, alice, jid) if r in ("PreemptionRequested", "RequeuedByAdmin", "Requeued")] == [
        "PreemptionRequested",
        "RequeuedByAdmin",
        "Requeued",
    ]
    workdir = Path(c.app.state.platform.settings.workspaces) / "alice" / "jobs" / jid
    assert "requeued by admin admin: node swap" in (workdir / "notice-seen").read_text()
    actions = [e["action"] for e in c.get("/api/v1/audit", headers=admin).json()["entries"]]
    assert actions[0] == "requeue-job"
    c.post(f"/api/v1/jobs/{jid}/cancel", headers=alice)
    _until(api, alice, jid, {"Cancelled"})


def test_a_chain_runs_in_order(api, admin):
    loop = api.client.app.state.loop
    a = _submit(api, admin, name="first", command=["sleep", "2"], resources=TINY)
    b = _submit(api, admin, name="second", command=["true"], resources=TINY, after=[{"job": a}])
    _until(api, admin, a, {"Running"})
    loop.tick()
    assert _state(api, admin, b)["state"] == "Queued"
    reasons = _why(api, admin, b)["pending"]
    assert [r["code"] for r in reasons] == ["Dependency"]
    assert reasons[0]["message"] == f"waiting for job {a} to end (it is Running); it must succeed"
    assert ZH.pending(reasons[0]) == f"等待作业 {a} 结束（当前运行中）；它须成功结束"
    done = _until(api, admin, b, {"Succeeded"})
    assert done["started_at"] >= _state(api, admin, a)["finished_at"]


def test_a_failed_dependency_cancels_under_ok_and_not_under_any(api, admin):
    alice = api.user(admin, "alice")
    a = _submit(api, admin, name="fails", command=["sh", "-c", "exit 3"], resources=TINY)
    ok = _submit(api, admin, name="needs-success", command=["true"], resources=TINY, after=[{"job": a, "when": "ok"}])
    any_ = _submit(api, admin, name="needs-end", command=["true"], resources=TINY, after=[{"job": a, "when": "any"}])
    _until(api, admin, a, {"Failed"})
    j = _until(api, admin, ok, {"Cancelled"})
    assert j["reason"] == "DependencyFailed" and a in j["message"]
    assert _until(api, admin, any_, {"Succeeded"})
    with api.client.app.state.platform.session() as db:
        event = next(e for e in db.scalars(_events_of(ok)) if e.reason == j["reason"])
        assert ZH.event(event) == f"其依赖的作业 {a} 最终状态为已失败，而本作业要求它成功"

    # a dependency must be a job its owner sees: another user's is as unknown as none
    for after in ([{"job": a}], [{"job": "0123456789"}], [{"job": a, "when": "later"}]):
        r = api.client.post("/api/v1/jobs", json={"name": "x", "command": ["true"], "after": after}, headers=alice)
        assert r.status_code in (400, 422) and "after" in r.text, r.text


def _events_of(job_id):
    from sqlalchemy import select

    from caldera.db.models import JobEventRow

    return select(JobEventRow).where(JobEventRow.job_id == job_id)
