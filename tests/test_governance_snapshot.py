"""An idle Jupyter session's stop waits for its snapshot (the container runtime saves it; here the image row the
snapshot fills in is set as the build queue would): the stop event names the snapshot when it is ready, and a
snapshot that fails or outlasts ``idle_snapshot_timeout_s`` does not keep the GPUs held."""

from __future__ import annotations

import time

from caldera.db.models import Image, Job, JobGovernance
from caldera.images import catalogue
from caldera.server.governor import state_of
from tests.test_governance_requests import _events, _job, world  # noqa: F401 - the fixture
from tests.test_runs import _until


def _saving(platform, job: str, image_state: str, started_ago: float = 0.0) -> None:
    """The governor's record of a stop waiting for a snapshot, and the image being built."""
    with platform.session() as db:
        owner = db.get(Job, job).user_id
        img = Image(id=f"img{job[:6]}", owner_id=owner, namespace="user/owner", name="sessions", tag=f"idle-{job}",
                    visibility="private", source="snapshot", form={"job_id": job}, state=image_state, message="",
                    size_bytes=0, created_at=time.time())  # fmt: skip
        db.add(img)
        gov = state_of(db, job)
        gov.snapshot_image = img.id
        gov.pending_stop = {"message": "stopped: idle", "params": {"window": "2h 0m", "grace": "1h 0m"},
                            "at": time.time() - started_ago}  # fmt: skip
        db.commit()


def _cycle(api, platform) -> None:
    with platform.session() as db:
        api.client.app.state.loop.governor.apply(db, {}, None, time.time())
        db.commit()


def test_the_stop_waits_for_the_snapshot_and_names_it(world):  # noqa: F811
    api, people, platform = world
    job = _job(api, people["owner"])
    _saving(platform, job, "building")
    _cycle(api, platform)
    with platform.session() as db:
        assert db.get(Job, job).stop_requested is None  # still saving: still running
        db.get(Image, f"img{job[:6]}").state = "ready"
        db.commit()
    _cycle(api, platform)
    done = _until(api, people["owner"], job, {"Cancelled"})
    assert done["reason"] == "IdleStopped"
    with platform.session() as db:
        ref = catalogue.reference(platform.settings, db.get(Image, f"img{job[:6]}"))
        assert db.get(JobGovernance, job).pending_stop is None
    assert ref in done["message"] and ref.endswith(f"user/owner/sessions:idle-{job}")
    (stopped,) = [e for e in api.client.get(f"/api/v1/jobs/{job}", headers=people["owner"]).json()["events"]
                  if e["reason"] == "IdleStopped" and e["to"] == "Cancelled"]  # fmt: skip
    assert ref in stopped["message"]


def test_a_snapshot_that_takes_too_long_or_fails_does_not_hold_the_gpus(world):  # noqa: F811
    api, people, platform = world
    slow, failed = _job(api, people["owner"]), _job(api, people["owner"])
    _saving(platform, slow, "building", started_ago=platform.settings.idle_snapshot_timeout_s + 1)
    _saving(platform, failed, "failed")
    _cycle(api, platform)
    for job in (slow, failed):
        done = _until(api, people["owner"], job, {"Cancelled"})
        assert done["reason"] == "IdleStopped" and "saved as" not in done["message"]
        assert "IdleStopped" in _events(api, people["owner"], job)
