"""The node agent end to end on this host: a real job process that declares its fake GPU load, sampled through the
fake source and through NVML (a fake NVML library), scraped over HTTP from 127.0.0.1 in the Prometheus text format."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from caldera.config import FakeGpu, Settings
from caldera.metrics import sources
from caldera.metrics.agent import Agent
from caldera.metrics.jobstats import cgroup_stats, process_tree_stats
from caldera.metrics.sources.base import Holding, SourceUnavailable
from caldera.metrics.sources.fake.source import LOAD_FILE, FakeSource
from caldera.metrics.sources.nvml.source import NvmlSource
from tests.metrics.fake_nvml import FakeNvml


def _settings(tmp_path: Path, **kw) -> Settings:
    return Settings(data_dir=tmp_path, runtime="local", fake_gpus=[FakeGpu(model="a100")] * 2, **kw)


def _holding(job: str, gpus: tuple[int, ...], workdir: Path | None, start: float, end: float | None = None,
             pids: tuple[int, ...] = ()) -> Holding:  # fmt: skip
    return Holding(job, f"u-{job}", "lab", "default", gpus, start, end, pids, workdir)


def _series(agent: Agent, name: str) -> dict[tuple, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{agent.port}/metrics", timeout=5).read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = s.value
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def serve():
    servers = []

    def start(agent: Agent) -> Agent:
        agent.port = _free_port()
        servers.append(agent.serve(agent.port))
        return agent

    yield start
    for s in servers:
        s.shutdown()


def test_a_job_that_loads_a_fake_gpu_shows_its_series_and_its_process_tree(tmp_path, serve):
    workdir = tmp_path / "runs" / "j1"
    workdir.mkdir(parents=True)
    # a real job: a shell whose child burns CPU, allocates memory, and writes its declared load
    script = (
        f"import json,time; open({str(workdir / LOAD_FILE)!r},'w').write(json.dumps({{'utilisation': 75, "
        "'memory_mib': 3000}));\nx=bytearray(64*2**20)\nend=time.time()+30\nwhile time.time()<end: pass"
    )
    job = subprocess.Popen(["sh", "-c", f'{sys.executable} -c "$0"; true', script])
    try:
        deadline = time.time() + 10
        while not (workdir / LOAD_FILE).exists() and time.time() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
        holding = _holding("j1", (1,), workdir, time.time() - 5, pids=(job.pid,))
        agent = serve(Agent("n1", FakeSource(_settings(tmp_path)), lambda: [holding]))
        agent.sample_once()
        util = _series(agent, "caldera_gpu_utilisation_percent")
        assert util[(("gpu", "1"), ("gpu_model", "a100"), ("node", "n1"))] == 75.0
        assert util[(("gpu", "0"), ("gpu_model", "a100"), ("node", "n1"))] == 0.0
        job_util = _series(agent, "caldera_job_gpu_utilisation_percent")
        assert list(job_util.values()) == [75.0]
        (labels,) = job_util
        assert dict(labels) == {"node": "n1", "gpu": "1", "gpu_model": "a100", "job": "j1", "user": "u-j1",
                                "account": "lab", "queue": "default"}  # fmt: skip
        assert list(_series(agent, "caldera_job_gpu_memory_used_bytes").values()) == [3000 * 2**20]
        # the CPU-burning grandchild is counted through the shell: the tree, not the root process alone
        (cpu,) = _series(agent, "caldera_job_cpu_seconds").values()
        (mem,) = _series(agent, "caldera_job_memory_bytes").values()
        assert cpu > 0.05 and mem > 64 * 2**20
    finally:
        job.kill()
        job.wait()


def test_a_sample_after_a_job_ended_is_not_given_to_the_next_job_on_that_gpu(tmp_path, serve):
    old_dir, new_dir = tmp_path / "old", tmp_path / "new"
    for d, util in ((old_dir, 90), (new_dir, 10)):
        d.mkdir()
        (d / LOAD_FILE).write_text(json.dumps({"utilisation": util}))
    now = time.time()
    ended = _holding("old", (0,), old_dir, now - 100, end=now - 1)
    placed = _holding("new", (0,), new_dir, now + 1)  # placed, but its attempt starts after this sample
    agent = serve(Agent("n1", FakeSource(_settings(tmp_path)), lambda: [ended, placed]))
    agent.sample_once(at=now)
    assert _series(agent, "caldera_job_gpu_utilisation_percent") == {}
    assert _series(agent, "caldera_gpu_utilisation_percent")[(("gpu", "0"), ("gpu_model", "a100"), ("node", "n1"))] == 0
    agent.sample_once(at=now + 2)
    assert [dict(k)["job"] for k in _series(agent, "caldera_job_gpu_utilisation_percent")] == ["new"]


def test_a_fake_load_file_that_is_garbage_or_huge_reads_as_idle(tmp_path):
    source = FakeSource(_settings(tmp_path))
    for content in (b"not json", b'{"utilisation": "x"}', b"[1]", b'{"utilisation": 50' + b" " * 10_000 + b"}"):
        (tmp_path / LOAD_FILE).write_bytes(content)
        (s0, _) = source.sample([_holding("j", (0,), tmp_path, 0)], 1.0)
        assert (s0.utilisation, s0.memory_used) == (0.0, 0)
    secret = tmp_path / "secret.json"
    secret.write_text('{"utilisation": 60}')
    (tmp_path / LOAD_FILE).unlink()
    (tmp_path / LOAD_FILE).symlink_to(secret)  # a file of the host's the job cannot read itself: not followed
    (s0, _) = source.sample([_holding("j", (0,), tmp_path, 0)], 1.0)
    assert s0.utilisation == 0.0
    (tmp_path / LOAD_FILE).unlink()
    os.mkfifo(tmp_path / LOAD_FILE)  # a FIFO nobody writes would block a reader: not opened as a file
    (s0, _) = source.sample([_holding("j", (0,), tmp_path, 0)], 1.0)
    assert s0.utilisation == 0.0
    (tmp_path / LOAD_FILE).unlink()
    (tmp_path / LOAD_FILE).write_text('{"utilisation": 900, "memory_mib": 999999}')
    (s0, _) = source.sample([_holding("j", (0,), tmp_path, 0)], 1.0)
    assert (s0.utilisation, s0.memory_used) == (100.0, 16384 * 2**20)  # clamped to the device


def test_nvml_source_attributes_a_shared_gpu_by_the_processes_using_it(tmp_path, serve):
    nv = FakeNvml({0: {101: 2**30}, 1: {}})
    a = _holding("a", (0,), None, 0, pids=(100,))
    b = _holding("b", (0, 1), None, 0, pids=(200,))
    agent = Agent("n1", NvmlSource(_settings(tmp_path), nvml=nv), lambda: [a, b])
    agent.sample_once(at=10)  # pid 101 is in neither list: both holders get the shared GPU's sample
    serve(agent)
    assert sorted(dict(k)["job"] for k in _series(agent, "caldera_job_gpu_utilisation_percent")) == ["a", "b", "b"]
    a2 = _holding("a", (0,), None, 0, pids=(101,))
    agent.holdings = lambda: [a2, b]
    agent.sample_once(at=10)
    on_gpu0 = {dict(k)["job"]: v for k, v in _series(agent, "caldera_job_gpu_utilisation_percent").items()
               if dict(k)["gpu"] == "0"}  # fmt: skip
    assert on_gpu0 == {"a": 90.0}
    power = _series(agent, "caldera_gpu_power_watts")
    assert list(power.values()) == [250.0]  # device 1 does not report power: no series rather than a failure
    assert set(_series(agent, "caldera_gpu_sm_clock_mhz").values()) == {1410.0}


def _entry_points_installed(tmp_path: Path, monkeypatch) -> dict[str, str]:
    """pyproject.toml's metric sources, as an installed distribution would declare them (an editable install made
    before this group existed does not)."""
    declared = tomllib.loads(Path("pyproject.toml").read_text())["project"]["entry-points"][sources.GROUP]
    dist = tmp_path / "caldera_metrics_test-0.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text("Name: caldera-metrics-test\nVersion: 0\n")
    (dist / "entry_points.txt").write_text(
        f"[{sources.GROUP}]\n" + "".join(f"{k} = {v}\n" for k, v in declared.items())
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return declared


def test_metric_sources_are_entry_points_and_say_why_they_cannot_start(tmp_path, monkeypatch):
    assert set(_entry_points_installed(tmp_path, monkeypatch)) == {"nvml", "fake", "dcgm"}
    assert isinstance(sources.create_source(_settings(tmp_path, metrics_source="fake")), FakeSource)
    with pytest.raises(SourceUnavailable, match="no fake GPUs"):
        sources.create_source(Settings(data_dir=tmp_path, runtime="local", metrics_source="fake"))
    with pytest.raises(SourceUnavailable, match="unknown metric source"):
        sources.create_source(_settings(tmp_path, metrics_source="nope"))


def test_cgroup_stats_read_cgroup_v2_files(tmp_path):
    (tmp_path / "cpu.stat").write_text("usage_usec 2500000\nuser_usec 2000000\n")
    (tmp_path / "memory.current").write_text("1048576\n")
    (tmp_path / "io.stat").write_text("8:0 rbytes=100 wbytes=200 rios=1\n8:16 rbytes=5 wbytes=7\n")
    st = cgroup_stats(tmp_path)
    assert (st.cpu_seconds, st.memory_bytes, st.read_bytes, st.write_bytes) == (2.5, 1048576, 105, 207)


def test_process_tree_of_a_gone_process_is_empty():
    p = subprocess.Popen(["true"])
    p.wait()
    assert process_tree_stats((p.pid,)).memory_bytes == 0
