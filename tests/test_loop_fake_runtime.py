"""The live loop and the API over the in-memory fake runtime: what the platform does with a runtime's answers
(launch, phases, exit codes, launch errors, cancel, re-attach after a restart), without starting a process."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from caldera.server.app import create_app
from caldera.server.platform import Platform
from caldera.server.tenancy import bootstrap, usernames
from tests.conftest import Api, make_settings
from tests.fake_runtime import FakeRuntime
from tests.test_runs import _submit, _until


@pytest.fixture
def fake_settings(tmp_path):
    return make_settings(tmp_path, f"sqlite:///{tmp_path / 'caldera.db'}", run_jobs_as="server")


def _api(settings) -> tuple[Api, FakeRuntime, TestClient]:
    fake = FakeRuntime(settings)
    platform = Platform.create(settings, runtime=fake)
    with platform.session() as db:
        bootstrap(db, "admin-password")
        db.commit()
    client = TestClient(create_app(platform, run_loop=False))
    client.__enter__()
    return Api(client), fake, client


@pytest.fixture
def fake_api(fake_settings):
    api, fake, client = _api(fake_settings)
    yield api, fake
    client.__exit__(None, None, None)


def _events(job: dict) -> list[str]:
    return [e["reason"] for e in job["events"]]


def test_a_job_is_launched_with_its_allocation_and_succeeds(fake_api) -> None:
    api, fake = fake_api
    admin = api.login("admin", "admin-password")
    jid = _submit(api, admin, name="t", command=["sleep", "0.5"], resources={"gpu": 2})
    running = _until(api, admin, jid, {"Running"})
    assert running["attempt"] == 1
    (req,) = fake.launched
    assert req.job_id == jid and len(req.allocations[0].gpus) == 2
    assert req.env["CALDERA_ACCOUNT"] == "default"
    done = _until(api, admin, jid, {"Succeeded"})
    assert done["exit_code"] == 0
    assert _events(done)[-3:] == ["Scheduled", "Running", "Completed"]


def test_exit_codes_and_launch_errors_fail_the_job_with_their_reason(fake_api) -> None:
    api, _ = fake_api
    admin = api.login("admin", "admin-password")
    failing = _submit(api, admin, name="f", command=["false"])
    missing = _submit(api, admin, name="m", command=["no-such-program"])
    assert _until(api, admin, failing, {"Failed"})["exit_code"] == 1
    job = _until(api, admin, missing, {"Failed"})
    last = job["events"][-1]
    assert last["reason"] == "CommandNotFound" and "command not found: no-such-program" in last["message"]


def test_cancel_stops_a_running_job(fake_api) -> None:
    api, _ = fake_api
    admin = api.login("admin", "admin-password")
    jid = _submit(api, admin, name="c", command=["sleep", "600"])
    _until(api, admin, jid, {"Running"})
    assert api.client.post(f"/api/v1/jobs/{jid}/cancel", headers=admin).status_code == 200
    assert _until(api, admin, jid, {"Cancelled"})["state"] == "Cancelled"


def test_a_restarted_server_reattaches_through_a_new_runtime_instance(fake_settings) -> None:
    api, _, client = _api(fake_settings)
    admin = api.login("admin", "admin-password")
    jid = _submit(api, admin, name="r", command=["sleep", "600"])  # still running however slow the restart
    _until(api, admin, jid, {"Running"})
    client.__exit__(None, None, None)  # the server is gone; the job is not

    api, fake, client = _api(fake_settings)
    try:
        admin = api.login("admin", "admin-password")
        api.client.app.state.loop.recover()
        assert "Reattached" in _events(api.client.get(f"/api/v1/jobs/{jid}", headers=admin).json())
        assert fake.launched == []  # found again, not launched again
        assert api.client.post(f"/api/v1/jobs/{jid}/cancel", headers=admin).status_code == 200  # and controlled
        assert _until(api, admin, jid, {"Cancelled"})["state"] == "Cancelled"
    finally:
        client.__exit__(None, None, None)


def test_the_snapshot_counts_each_jobs_preemptions_from_its_attempts(fake_api) -> None:
    """The policy's bound on preemptions of one job (max_preemptions_per_job) sees the live loop's jobs too."""
    api, _ = fake_api
    admin = api.login("admin", "admin-password")
    running = _submit(api, admin, name="r", command=["sleep", "30"], resources={"gpu": 4})
    _until(api, admin, running, {"Running"})
    queued = _submit(api, admin, name="q", command=["true"], resources={"gpu": 4})  # waits for the first
    loop = api.client.app.state.loop
    from caldera.db.models import Job

    with loop.p.session() as db:
        db.get(Job, running).attempt = 4  # three earlier attempts, each re-queued
        db.get(Job, queued).attempt = 2  # re-queued twice, waiting for its third
        db.commit()
        snap = loop._snapshot(db, 0.0, {}, {}, usernames(db))
    by_id = {j.id: j for j in (*snap.queued, *snap.running)}
    assert (by_id[running].preemptions, by_id[queued].preemptions) == (3, 2)


def test_a_passing_failure_to_observe_does_not_end_a_running_job(fake_api, monkeypatch) -> None:
    """One cycle whose observe() fails (a podman command that timed out, say) notes it and keeps the job and its
    GPUs; the runtime is asked to end the attempt only once observing has failed for the grace period."""
    from caldera.server import loop as loop_module

    api, fake = fake_api
    admin = api.login("admin", "admin-password")
    jid = _submit(api, admin, name="r", command=["sleep", "30"], resources={"gpu": 1})
    _until(api, admin, jid, {"Running"})
    ended: list[str] = []
    monkeypatch.setattr(fake, "end_attempt", lambda job_id, attempt: ended.append(job_id) or True, raising=False)
    real = fake.observe
    monkeypatch.setattr(fake, "observe", lambda handle: (_ for _ in ()).throw(TimeoutError("podman timed out")))
    loop = api.client.app.state.loop
    loop.tick()
    job = api.client.get(f"/api/v1/jobs/{jid}", headers=admin).json()
    assert job["state"] == "Running" and _events(job)[-1] == "Unobservable" and not ended
    monkeypatch.setattr(fake, "observe", real)  # it answers again: nothing happened to the job
    loop.tick()
    assert api.client.get(f"/api/v1/jobs/{jid}", headers=admin).json()["state"] == "Running" and not ended
    # a failure that lasts past the grace: the attempt is ended, then Lost
    monkeypatch.setattr(fake, "observe", lambda handle: (_ for _ in ()).throw(TimeoutError("podman timed out")))
    monkeypatch.setattr(loop_module, "_UNOBSERVABLE_GRACE_S", 0.0)
    loop.tick()
    job = api.client.get(f"/api/v1/jobs/{jid}", headers=admin).json()
    assert job["state"] == "Lost" and job["reason"] == "ReattachFailed" and ended == [jid]
