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
