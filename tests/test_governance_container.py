"""An idle Jupyter session under the real container runtime (podman, buildah, docker-registry): governance warns
it, saves it as a snapshot image, stops it with an event that names the image, and its owner resumes it in one
click from the job's page into a session that has what the first one had. GPU samples are given to the governor
(the live agent and Prometheus are tests/test_governance_live.py's)."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import select

from caldera.core.governance import Governance, IdleRule
from caldera.db.models import Job, User
from caldera.images import registry
from tests.conftest import wait_for
from tests.images_fixtures import registry_port  # noqa: F401 - fixture
from tests.needs import buildah_usable, podman_usable  # noqa: F401 - fixtures
from tests.portal import browser_for, post_form
from tests.test_images_build import _built
from tests.test_images_snapshot import _exec, db_url, settings  # noqa: F401 - fixtures
from tests.test_runs import _submit, _until

pytestmark = pytest.mark.usefixtures("buildah_usable", "podman_usable")


def _events(api, who, job) -> list[dict]:
    return api.client.get(f"/api/v1/jobs/{job}", headers=who).json()["events"]


@pytest.mark.timeout(900)  # a first run builds the lab image too
def test_an_idle_session_is_saved_stopped_and_resumed(api, admin, settings):  # noqa: F811
    ana = api.user(admin, "ana")
    lab = _built(api, ana, {"name": "lab", "tag": "1", "jupyter": True})
    assert lab["state"] == "ready", lab
    jid = _submit(api, ana, name="lab", kind="jupyter", image=lab["reference"], resources={"gpu": 1})
    job = _until(api, ana, jid, {"Running", "Failed"}, timeout=120)
    assert job["state"] == "Running", job
    platform = api.client.app.state.platform
    with platform.session() as db:
        uid = db.scalar(select(User.os_uid).where(User.username == "ana"))
        started = db.get(Job, jid).started_at
    done = _exec(job, uid, "echo kept > /opt/venv/ana-note")
    assert done.returncode == 0, done

    governor = api.client.app.state.loop.governor
    rules = {"default": Governance(idle_interactive=IdleRule(enabled=True, window_s=600, grace_s=60))}
    samples = {jid: {"node-0/0": [(started + t, 0.0) for t in range(0, 1201, 10)]}}

    def govern(at: float) -> None:
        with platform.state_lock, platform.session() as db:
            governor.apply(db, rules, samples, at)
            db.commit()

    govern(started + 1000)  # idle for the window: warned
    govern(started + 1100)  # and through the grace period: saved first, still running meanwhile
    reasons = [e["reason"] for e in _events(api, ana, jid)]
    assert reasons.index("IdleWarning") < reasons.index("IdleSnapshot"), reasons
    assert _until(api, ana, jid, {"Running"})["state"] == "Running"
    ref = f"{registry.host(settings)}/user/ana/sessions:idle-{jid}-1"

    def stopped():
        govern(time.time())
        return _until(api, ana, jid, {"Running", "Cancelled"})["state"] == "Cancelled"

    wait_for(stopped, timeout=300, interval=2, what="the snapshot, then the stop")
    final = api.client.get(f"/api/v1/jobs/{jid}", headers=ana).json()
    assert final["reason"] == "IdleStopped" and ref in final["message"], final
    (stop,) = [e for e in _events(api, ana, jid) if e["reason"] == "IdleStopped" and e["to"] == "Cancelled"]
    assert ref in stop["message"]
    assert "idle-" + jid + "-1" in registry.tags(settings, "user/ana/sessions")

    # one click from the job's page: the same session on the snapshot, with what the user had put there
    portal = browser_for(api.client, "ana", "password-123")
    assert 'id="resume-snapshot"' in portal.get(f"/jobs/{jid}").text
    r = post_form(portal, f"/jobs/{jid}/resume-snapshot", {})
    assert r.status_code == 303, r.text
    again = r.headers["location"].rsplit("/", 1)[1]
    resumed = _until(api, ana, again, {"Running", "Failed"}, timeout=120)
    assert resumed["state"] == "Running" and resumed["spec"]["image"] == ref, resumed
    found = _exec(resumed, uid, "cat /opt/venv/ana-note")
    assert found.stdout.split() == ["kept"], found
    api.client.post(f"/api/v1/jobs/{again}/cancel", headers=ana)
    _until(api, ana, again, {"Cancelled"}, timeout=120)
