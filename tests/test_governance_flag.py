"""A batch job whose queue only flags idle GPUs: its user is told once (notification ``idle_flag``, in their
language), never the ``idle_warning`` that promises a stop, and the job keeps running."""

from __future__ import annotations

from caldera.core.governance import IdleRule
from caldera.db.models import Job
from caldera.server import tenancy
from tests.test_governance_requests import _events, _job, world  # noqa: F401 - the fixture

HOUR = 3600


def _told(api, who, job) -> list[dict]:
    items = api.client.get("/api/v1/notifications", headers=who).json()["items"]
    return [n for n in items if n["job_id"] == job]


def test_a_flagged_batch_job_is_told_to_its_user_once_and_keeps_running(world):  # noqa: F811
    api, people, platform = world
    owner = people["owner"]
    r = api.client.put("/api/v1/notifications/settings", json={"language": "zh"}, headers=owner)
    assert r.status_code == 200, r.text
    job = _job(api, owner)
    governor = api.client.app.state.loop.governor
    rule = IdleRule(enabled=True, window_s=600, grace_s=60, stop=False)
    with platform.session() as db:
        rules = tenancy.all_queue_configs(db)["lab"].governance.model_copy(update={"idle_batch": rule})
        started = db.get(Job, job).started_at
    samples = {job: {"node-0/0": [(started + t, 0.0) for t in range(0, 2 * HOUR + 1, 10)]}}
    for at in (started + 1000, started + 1000 + HOUR):  # flagged once, then left alone
        with platform.session() as db:
            governor.apply(db, {"lab": rules}, samples, at)
            db.commit()
    told = _told(api, owner, job)
    assert [n["event"] for n in told] == ["idle_flag"], told
    assert "10m" in told[0]["body"] and "未使用 GPU" in told[0]["body"] and "不会被停止" in told[0]["body"]
    assert _events(api, owner, job).count("IdleFlagged") == 1
    with platform.session() as db:
        assert db.get(Job, job).stop_requested is None
    # another user is told nothing of it
    assert _told(api, people["stranger"], job) == []
