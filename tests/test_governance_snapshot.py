"""An idle Jupyter session's stop waits for its snapshot (the container runtime saves it; here the image row the
snapshot fills in is set as the build queue would): the stop event names the snapshot when it is ready, and a
snapshot that fails or outlasts ``idle_snapshot_timeout_s`` does not keep the GPUs held."""

from __future__ import annotations

import time

from caldera.db.models import Image, Job, JobGovernance
from caldera.images import catalogue
from caldera.server.governor import state_of
from tests.portal import browser_for, post_form
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


def _idle_stopped(api, people, platform, image_state: str) -> str:
    """A job of the owner that governance stopped for idleness, its snapshot in ``image_state``."""
    job = _job(api, people["owner"])
    _saving(platform, job, image_state)
    _cycle(api, platform)
    assert _until(api, people["owner"], job, {"Cancelled"})["reason"] == "IdleStopped"
    return job


def test_the_owner_resumes_from_the_snapshot_in_one_click(world):  # noqa: F811
    api, people, platform = world
    job = _idle_stopped(api, people, platform, "ready")
    with platform.session() as db:
        ref = catalogue.reference(platform.settings, db.get(Image, f"img{job[:6]}"))
    owner, stranger = (browser_for(api.client, who, "password-123") for who in ("owner", "stranger"))
    admin = browser_for(api.client, "admin", "admin-password")
    assert 'id="resume-snapshot"' in owner.get(f"/jobs/{job}").text
    assert 'id="resume-snapshot"' not in admin.get(f"/jobs/{job}").text  # an admin sees the job, not the button
    for other in (stranger, admin):  # no one but the owner runs the owner's session again
        assert post_form(other, f"/jobs/{job}/resume-snapshot", {}).status_code in (403, 404)
    r = owner.post(f"/jobs/{job}/resume-snapshot", data={})  # no CSRF token: refused
    assert r.status_code in (400, 403) and "location" not in r.headers
    r = post_form(owner, f"/jobs/{job}/resume-snapshot", {})
    assert r.status_code == 303, r.text
    again = r.headers["location"].rsplit("/", 1)[1]
    resumed = api.client.get(f"/api/v1/jobs/{again}", headers=people["owner"]).json()
    before = api.client.get(f"/api/v1/jobs/{job}", headers=people["owner"]).json()["spec"]
    assert resumed["spec"] == {**before, "queue": "lab", "image": ref}  # the same job, in the queue it ran in
    _until(api, people["owner"], again, {"Running"})
    api.client.post(f"/api/v1/jobs/{again}/cancel", headers=people["owner"])


def test_no_resume_without_a_ready_snapshot(world):  # noqa: F811
    api, people, platform = world
    job = _idle_stopped(api, people, platform, "failed")
    owner = browser_for(api.client, "owner", "password-123")
    assert 'id="resume-snapshot"' not in owner.get(f"/jobs/{job}").text
    assert post_form(owner, f"/jobs/{job}/resume-snapshot", {}).status_code == 404
