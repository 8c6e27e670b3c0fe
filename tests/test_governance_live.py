"""End to end: real jobs (process runtime) that write their fake GPU load, the platform's agent, Debian's real
Prometheus and the live loop with short windows. An idle job is warned (event, notification) and stopped with its
reason code; a job used again during the grace period is not stopped."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from caldera.core.governance import IdleRule
from caldera.db.models import Job, JobGovernance
from caldera.metrics import prometheus
from caldera.metrics.agent import Agent
from caldera.metrics.sources.fake.source import LOAD_FILE, FakeSource
from caldera.server import tenancy
from caldera.server.metrics import holdings
from tests.conftest import api_on, free_port, make_settings
from tests.portal import browser_for, post_form
from tests.test_runs import _state, _submit, _until

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None, reason="Debian's prometheus is not installed")

# idle under 5% for 4 s, stopped 4 s after the warning: batch jobs of this queue are watched and stopped
RULE = IdleRule(enabled=True, threshold_percent=5, window_s=4, grace_s=4, stop=True)


@pytest.fixture
def live(tmp_path):
    settings = make_settings(
        tmp_path,
        runtime="local",
        metrics_interval_s=0.5,
        metrics_port=free_port(),
        prometheus_port=free_port(),
        governance_interval_s=0.5,
        idle_max_gap_s=3,
    )
    with api_on(settings, None) as (api, admin):
        platform = api.client.app.state.platform
        with platform.session() as db:
            for cfg in tenancy.all_queue_configs(db).values():
                rules = cfg.governance.model_copy(update={"idle_batch": RULE})
                tenancy.put_queue(db, cfg.model_copy(update={"governance": rules}))
            db.commit()
        agent = Agent("node-0", FakeSource(settings), lambda: holdings(platform, "node-0"))
        server = agent.serve(settings.metrics_port)
        agent.start(settings.metrics_interval_s)
        proc = prometheus.start_local(settings, [f"127.0.0.1:{settings.metrics_port}"])
        try:
            yield api, admin
        finally:
            proc.terminate()
            proc.wait(10)
            server.shutdown()
            agent.stop()


def _events(api, admin, job) -> list[str]:
    return [e["reason"] for e in api.client.get(f"/api/v1/jobs/{job}/events", headers=admin).json()]


def _until_event(api, admin, job, reason, timeout=60.0) -> None:
    loop, deadline = api.client.app.state.loop, time.time() + timeout
    while reason not in _events(api, admin, job):
        assert time.time() < deadline, f"no {reason} for {job}: {_events(api, admin, job)}"
        loop.tick()
        time.sleep(0.2)


def _idle_job(api, admin, name: str) -> str:
    script = f'echo \'{{"utilisation": 0, "memory_mib": 500}}\' > {LOAD_FILE}; sleep 300'
    job = _submit(api, admin, name=name, command=["sh", "-c", script], resources={"gpu": 1})
    _until(api, admin, job, {"Running"})
    return job


def test_an_idle_job_is_warned_then_stopped_with_its_reason(live):
    api, admin = live
    job = _idle_job(api, admin, "idle")
    _until_event(api, admin, job, "IdleWarning")
    notes = api.client.get("/api/v1/notifications", headers=admin).json()
    assert any(n["event"] == "idle_warning" and n["job_id"] == job for n in notes["items"]), notes
    final = _until(api, admin, job, {"Cancelled"}, timeout=60)
    assert final["reason"] == "IdleStopped" and "idle" in final["message"]
    reasons = _events(api, admin, job)
    assert reasons.index("IdleWarning") < reasons.index("IdleStopped")


def test_a_job_used_again_during_the_grace_period_is_not_stopped(live):
    api, admin = live
    job = _idle_job(api, admin, "wakes")
    _until_event(api, admin, job, "IdleWarning")
    with api.client.app.state.platform.session() as db:
        workdir = Path(db.get(Job, job).workdir)
    (workdir / LOAD_FILE).write_text(json.dumps({"utilisation": 90, "memory_mib": 500}))
    _until_event(api, admin, job, "IdleCleared")
    loop, until = api.client.app.state.loop, time.time() + RULE.grace_s + 2
    while time.time() < until:  # past the grace period it once had: still running
        loop.tick()
        time.sleep(0.2)
    assert _state(api, admin, job)["state"] == "Running" and "IdleStopped" not in _events(api, admin, job)
    api.client.post(f"/api/v1/jobs/{job}/cancel", headers=admin)
    _until(api, admin, job, {"Cancelled"})


def test_a_job_that_used_one_of_four_gpus_is_advised_on_its_page_and_home(live):
    api, admin = live
    load = json.dumps({"0": {"utilisation": 80, "memory_mib": 4 * 1024}})
    script = f"echo '{load}' > {LOAD_FILE}; sleep 8"
    job = _submit(api, admin, name="wide", command=["sh", "-c", script], resources={"gpu": 4})
    _until(api, admin, job, {"Succeeded"}, timeout=90)
    platform = api.client.app.state.platform
    loop, deadline = api.client.app.state.loop, time.time() + 60
    while True:
        loop.tick()
        with platform.session() as db:
            gov = db.get(JobGovernance, job)
            if gov is not None and gov.advice is not None:
                break
        assert time.time() < deadline, "no advice"
        time.sleep(0.5)
    codes = {a["code"]: a["params"] for a in gov.advice}
    assert codes["FewerGpus"] == {"asked": 4, "used": 1}
    assert codes["SmallGpuMemory"] == {"peak_gib": 4.0, "total_gib": 16}
    browser = browser_for(api.client, "admin", "admin-password")
    page = browser.get(f"/jobs/{job}").text
    assert "asked for 4 GPUs and used 1: ask for 1 next time" in page
    home = browser.get("/").text
    assert f'<li data-job="{job}">' in home and "peak GPU memory 4 GiB of 16" in home
    # one click: the same job again, with one GPU it may share and the memory it used (and a quarter more)
    r = post_form(browser, f"/jobs/{job}/resubmit-advised", {})
    assert r.status_code == 303, r.text
    again = r.headers["location"].rsplit("/", 1)[1]
    spec = api.client.get(f"/api/v1/jobs/{again}", headers=admin).json()["spec"]
    assert spec["resources"]["gpu"] == 1 and spec["resources"]["gpu_memory_mib"] == 5120 and spec["shareable"] is True
    assert spec["command"] == ["sh", "-c", script]
    api.client.post(f"/api/v1/jobs/{again}/cancel", headers=admin)
    _until(api, admin, again, {"Cancelled"}, timeout=60)
