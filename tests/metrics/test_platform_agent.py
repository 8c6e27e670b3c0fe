"""The agent inside the platform: a running job (process runtime) that writes its fake GPU load in its working
directory is found through the platform's allocations, with its processes, and its series carry its labels."""

from __future__ import annotations

import time

import pytest

from caldera.metrics.agent import Agent
from caldera.metrics.sources import create_source
from caldera.server.metrics import holdings
from tests.conftest import api_on, make_settings
from tests.metrics.test_agent import _entry_points_installed
from tests.test_runs import _submit, _until


@pytest.fixture
def local_api(tmp_path):
    with api_on(make_settings(tmp_path, runtime="local"), None) as pair:
        yield pair


def test_a_running_job_is_held_and_measured(local_api, tmp_path, monkeypatch):
    _entry_points_installed(tmp_path, monkeypatch)
    api, admin = local_api
    script = 'echo \'{"utilisation": 65, "memory_mib": 1000}\' > gpu_load.json; sleep 60'
    job = _submit(api, admin, name="load", command=["sh", "-c", script], resources={"gpu": 1})
    _until(api, admin, job, {"Running"})
    platform = api.client.app.state.platform
    deadline = time.time() + 20
    while time.time() < deadline:
        (h,) = holdings(platform, "node-0")
        if h.workdir and (h.workdir / "gpu_load.json").exists():
            break
        time.sleep(0.2)
    assert (h.job, h.user, len(h.gpus)) == (job, "admin", 1) and h.pids
    agent = Agent("node-0", create_source(platform.settings), lambda: holdings(platform, "node-0"))
    agent.sample_once()
    (sample,) = [
        s for m in agent.registry.collect() if m.name == "caldera_job_gpu_utilisation_percent" for s in m.samples
    ]
    assert sample.value == 65.0 and sample.labels["job"] == job and sample.labels["gpu"] == str(h.gpus[0])
    mem = [s for m in agent.registry.collect() if m.name == "caldera_job_memory_bytes" for s in m.samples]
    assert mem and mem[0].value > 0  # the job's shell and sleep, summed from /proc
    api.client.post(f"/api/v1/jobs/{job}/cancel", headers=admin)
    _until(api, admin, job, {"Cancelled"})
    assert holdings(platform, "node-0") == []
