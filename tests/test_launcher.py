"""Launches run off the scheduling loop: a slow launch holds neither cycles nor other jobs, a failed one fails its
job with the runtime's typed reason, and a job cancelled while its launch is in flight is stopped once it exists."""

import threading

from tests.conftest import wait_for
from tests.test_runs import _state, _submit, _until


def _events(api, headers, jid):
    return [(e["to"], e["reason"]) for e in _state(api, headers, jid)["events"]]


def test_an_unknown_command_fails_with_the_runtimes_reason(api, admin):
    jid = _submit(api, admin, name="nf", command=["no-such-tool-here"])
    job = _until(api, admin, jid, {"Failed"})
    assert ("Failed", "CommandNotFound") in _events(api, admin, jid)
    assert "command not found: no-such-tool-here" in job["events"][-1]["message"]


def _hold_launches(platform, monkeypatch) -> threading.Event:
    release = threading.Event()
    real = platform.runtime.launch

    def slow_launch(req):
        if req.spec.name == "slow":
            assert release.wait(60), "test never released the launch"
        return real(req)

    monkeypatch.setattr(platform.runtime, "launch", slow_launch)
    return release


def test_a_slow_launch_does_not_hold_the_loop(api, admin, platform, monkeypatch):
    release = _hold_launches(platform, monkeypatch)
    loop = api.client.app.state.loop
    slow = _submit(api, admin, name="slow", command=["true"])
    loop.tick()
    assert _state(api, admin, slow)["state"] == "Starting"
    fast = _submit(api, admin, name="fast", command=["true"])
    _until(api, admin, fast, {"Succeeded"})  # cycles go on while the first launch is stuck
    assert _state(api, admin, slow)["state"] == "Starting"
    release.set()
    _until(api, admin, slow, {"Succeeded"})


def test_cancel_during_launch_stops_the_job_once_launched(api, admin, platform, monkeypatch):
    release = _hold_launches(platform, monkeypatch)
    loop = api.client.app.state.loop
    jid = _submit(api, admin, name="slow", command=["sleep", "600"])
    loop.tick()
    assert api.client.post(f"/api/v1/jobs/{jid}/cancel", headers=admin).status_code == 200
    release.set()
    wait_for(lambda: not loop.launcher.in_flight(jid, 1), what="the launch to return")
    job = _until(api, admin, jid, {"Cancelled", "Failed", "Succeeded"})
    assert job["state"] == "Cancelled"


def test_a_stored_spec_that_todays_rules_refuse_fails_its_job_not_the_cycle(api, admin, platform):
    from caldera.db.models import Job

    old = _submit(api, admin, name="old", command=["true"])
    with platform.session() as db:  # as stored by an earlier version, which took absolute paths
        job = db.get(Job, old)
        job.spec = {**job.spec, "workdir": "/etc"}
        db.commit()
    fine = _submit(api, admin, name="fine", command=["true"])
    assert _until(api, admin, old, {"Failed"})["events"][-1]["reason"] == "LaunchFailed"
    assert _until(api, admin, fine, {"Succeeded"})["state"] == "Succeeded"
