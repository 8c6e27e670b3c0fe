"""The platform's own solo records (caldera/server/solo_profiles.py): a shareable job's first minutes alone on its
GPU become a row of ``solo.csv`` with the profiler's columns; a partner joining, or the job ending first, drops the
window. The GPU columns come from a fake NVML here (no GPU); the CPU columns from a real job's processes."""

from __future__ import annotations

import csv
import sys
import time
from types import SimpleNamespace

import pytest

from caldera.core.cluster import Device, Node
from caldera.interference.profile.harness import SOLO_COLUMNS
from caldera.interference.records import JobType, load_profile_records
from caldera.runtime.base import ProcessUsage
from caldera.server.solo_profiles import SoloProfiler
from tests.conftest import make_settings
from tests.interference.fake_nvml import FakeNvml
from tests.test_runs import _state, _submit, _until

NODES = [Node("node-0", 16, 65536, (Device(0, "v100", 16384), Device(1, "v100", 16384)))]


class ScriptedRuntime:
    """Reports a job's processes as having used one core and 500 MiB so far per second of its life."""

    name = "local"

    def __init__(self) -> None:
        self.t = 0.0

    def usage(self, handle) -> ProcessUsage:
        return ProcessUsage(cpu_s=self.t, rss_mib=400 + 10 * self.t)


def _job(job_id: str, gpu: int, shareable: bool = True, started_at: float = 0.0, **spec) -> SimpleNamespace:
    return SimpleNamespace(
        id=job_id,
        attempt=1,
        handle={},
        started_at=started_at,
        stop_requested=None,
        spec={"name": job_id, "shareable": shareable, **spec},
        allocations=[{"node": "node-0", "gpus": [gpu], "cpu": 1, "memory_mib": 1024}],
    )


def _profiler(tmp_path, window_s: float = 10.0) -> tuple[SoloProfiler, ScriptedRuntime]:
    runtime = ScriptedRuntime()
    tmp_path.mkdir(exist_ok=True)
    settings = make_settings(tmp_path, sharing_profile_s=window_s)
    settings.profiles_dir.mkdir(parents=True)  # the platform lays it out (0700) when it starts
    profiler = SoloProfiler(settings, runtime, nvml=FakeNvml(gpm=True))
    profiler.gpu_period_s = 0.002  # the scripted clock runs faster than the sampler's real one
    return profiler, runtime


def _run(profiler: SoloProfiler, runtime: ScriptedRuntime, jobs, until: float, step: float = 1.0):
    written = []
    while runtime.t <= until:
        written += profiler.cycle(jobs, NODES, runtime.t)
        runtime.t += step
        time.sleep(0.01)  # the fake NVML sampler runs in its own thread
    return written


def test_a_shareable_job_alone_gets_a_solo_record_with_the_profilers_columns(tmp_path):
    profiler, runtime = _profiler(tmp_path)
    job = _job("j1", 0, workload="ResNet-50 (batch size 64)")
    written = _run(profiler, runtime, [job], until=12)
    assert [j.id for j, _, _ in written] == ["j1"]  # once, at the end of its window
    _, message, params = written[0]
    assert "first 10 s alone on node-0 GPU 0 (v100)" in message and "CPU 100% of a core" in message
    assert params == {"window_s": 10, "node": "node-0", "gpu": 0, "gpu_model": "v100", "cpu": 100,
                      "memory_mib": 500, "gpu_util": params["gpu_util"], "sm_active": 80}  # fmt: skip
    assert 50 <= params["gpu_util"] <= 60
    rows = list(csv.DictReader(profiler.path.open()))
    assert list(rows[0]) == SOLO_COLUMNS and len(rows) == 1
    row = rows[0]
    assert (row["model"], row["batchsize"], row["gpu_num"], row["gpu"]) == ("ResNet-50", "64", "1", "v100")
    assert float(row["cpu_usage"]) == pytest.approx(100.0)  # one CPU second per second
    assert float(row["cpu_mem_max"]) == pytest.approx(500.0)  # the peak seen within the window
    assert 50 <= float(row["gpu_util_avg"]) <= 60 and float(row["sm_active_avg"]) == 80.0  # NVML and GPM
    assert row["speed"] == "" and row["iter_avg_ms"] == ""  # not measured, never a made-up number
    # the records feed the decay model's training (``caldera interference train --records``)
    ds = load_profile_records(profiler.path.parent)
    profile = ds.profiles[JobType("ResNet-50", 64)]
    assert profile.metrics["gpu_util_avg"] == float(row["gpu_util_avg"]) and profile.solo == {}
    assert ds.samples == []
    from typer.testing import CliRunner

    from caldera.cli.main import app

    r = CliRunner().invoke(app, ["interference", "train", "--records", str(profiler.path.parent)])
    assert r.exit_code == 1 and "no co-location samples" in r.output  # not a traceback from the regressor


def test_no_record_for_a_job_that_shares_or_stops_sharing_or_ends_early(tmp_path):
    profiler, runtime = _profiler(tmp_path)
    pair = [_job("a", 0), _job("b", 0)]  # two jobs on GPU 0 from the start: neither is alone
    exclusive = _job("x", 1, shareable=False)
    assert _run(profiler, runtime, [*pair, exclusive], until=12) == []

    profiler, runtime = _profiler(tmp_path / "joined")
    lone = _job("lone", 1)
    _run(profiler, runtime, [lone], until=4)
    partner = _job("partner", 1, started_at=runtime.t)
    assert _run(profiler, runtime, [lone, partner], until=20) == []  # a partner joined: dropped, not resumed

    profiler, runtime = _profiler(tmp_path / "stopping")
    stopping = _job("stopping", 0)
    _run(profiler, runtime, [stopping], until=4)
    stopping.stop_requested = "cancel"  # still running while it winds down: no longer a solo measurement
    assert _run(profiler, runtime, [stopping], until=20) == []

    profiler, runtime = _profiler(tmp_path / "ended")
    _run(profiler, runtime, [_job("short", 0)], until=4)
    assert _run(profiler, runtime, [], until=20) == []  # ended within its window
    assert not profiler.path.exists() and not profiler._windows


def test_a_job_started_before_its_window_is_not_measured_late(tmp_path):
    profiler, runtime = _profiler(tmp_path)
    runtime.t = 100.0  # e.g. a server that came up long after the job started, or a job alone only later
    assert _run(profiler, runtime, [_job("old", 0, started_at=0.0)], until=130) == []


@pytest.fixture
def settings(tmp_path, db_url):
    return make_settings(tmp_path, db_url, sharing_profile_s=2.0)


def test_a_live_shareable_job_is_profiled_from_its_processes(api, admin, settings):
    """Through the loop and the process runtime: the record's CPU columns are the job's own processes."""
    burn = "import time; x = bytearray(64 << 20); t = time.time()\nwhile time.time() - t < 30: pass"
    job = _submit(
        api,
        admin,
        name="burn",
        command=[sys.executable, "-c", burn],
        resources={"gpu": 1, "gpu_memory_mib": 4000},
        shareable=True,
        workload="LM (batch size 20)",
    )
    _until(api, admin, job, {"Running"})
    path = settings.profiles_dir / "solo.csv"
    loop = api.client.app.state.loop

    def profiled():
        loop.tick()
        return path.exists() and list(csv.DictReader(path.open()))

    from tests.conftest import wait_for

    (row,) = wait_for(profiled, 30, what="the job's solo record")
    assert path.parent.stat().st_mode & 0o777 == 0o700  # other users' jobs cannot read who ran what
    assert (row["model"], row["batchsize"], row["gpu"]) == ("LM", "20", "a100")
    assert float(row["cpu_usage"]) > 40  # a busy loop: most of a core (the VM is shared)
    assert float(row["cpu_mem_max"]) > 64  # the 64 MiB it holds
    assert row["gpu_util_avg"] == ""  # declared fake GPUs: nothing to sample, so empty
    events = _state(api, admin, job)["events"]
    assert any(e["reason"] == "Profiled" and "alone on node-0 GPU" in e["message"] for e in events), events
    api.client.post(f"/api/v1/jobs/{job}/cancel", headers=admin)
    _until(api, admin, job, {"Cancelled"})
