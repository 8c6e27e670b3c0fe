"""End to end with Debian's real Prometheus: a job that loads a fake GPU is sampled by the agent, scraped by the
Prometheus the platform starts, and read back through PromQL with the query interface governance uses."""

from __future__ import annotations

import json
import shutil
import socket
import time

import pytest

from caldera.config import FakeGpu, Settings
from caldera.metrics import prometheus
from caldera.metrics.agent import Agent
from caldera.metrics.sources.base import Holding
from caldera.metrics.sources.fake.source import LOAD_FILE, FakeSource

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None, reason="Debian's prometheus is not installed")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_job_loading_a_fake_gpu_is_in_the_real_prometheus(tmp_path):
    settings = Settings(
        data_dir=tmp_path,
        runtime="local",
        fake_gpus=[FakeGpu(model="a100")] * 2,
        metrics_interval_s=1,
        metrics_port=_free_port(),
        prometheus_port=_free_port(),
    )
    workdir = tmp_path / "runs" / "j1"
    workdir.mkdir(parents=True)
    (workdir / LOAD_FILE).write_text(json.dumps({"utilisation": 80, "memory_mib": 2000}))
    holding = Holding("j1", "alice", "lab", "default", (1,), time.time(), workdir=workdir)
    agent = Agent("n1", FakeSource(settings), lambda: [holding])
    agent.start(settings.metrics_interval_s)
    server = agent.serve(settings.metrics_port)
    proc = prometheus.start_local(settings, [f"127.0.0.1:{settings.metrics_port}"])
    assert proc is not None
    try:
        assert (tmp_path / "prometheus" / "data").is_dir()
        deadline, found = time.time() + 30, []
        while not found and time.time() < deadline:
            found = prometheus.client(settings).job_gpu_utilisation(60)
            time.sleep(0.5)
        (u,) = found
        assert (u.job, u.node, u.gpu, u.mean_percent) == ("j1", "n1", "1", 80.0) and u.samples >= 1
        (series,) = prometheus.client(settings).instant('caldera_gpu_utilisation_percent{gpu="0"}')
        assert series["metric"]["gpu_model"] == "a100" and float(series["value"][1]) == 0.0
    finally:
        proc.terminate()
        proc.wait(10)
        server.shutdown()
        agent.stop()


def test_a_site_prometheus_by_url_is_not_started(tmp_path):
    settings = Settings(data_dir=tmp_path, runtime="local", prometheus_url="http://prom.example:9090")
    assert prometheus.start_local(settings, []) is None
    assert prometheus.url(settings) == "http://prom.example:9090"
