"""The DCGM source against a fake DCGM exporter: a real HTTP server on 127.0.0.1 serving a scrape in the exporter's
format with its real metric names and labels (tests/metrics/dcgm_exporter_scrape.txt: two A100s, one busy in a
Kubernetes pod, and a MIG instance of a third device), sampled by the node agent as NVML would be."""

from __future__ import annotations

from pathlib import Path

import pytest

from caldera.config import Settings
from caldera.metrics import sources
from caldera.metrics.agent import Agent
from caldera.metrics.sources.base import Holding, SourceUnavailable
from caldera.metrics.sources.dcgm.source import DcgmSource
from tests.metrics.test_agent import _entry_points_installed, _series
from tests.metrics.test_query import _reply, _server

SCRAPE = (Path(__file__).parent / "dcgm_exporter_scrape.txt").read_bytes()
MIB = 1024 * 1024


@pytest.fixture
def exporter():
    """The exporter's /metrics (a real HTTP server); ``answers["body"]`` is what it serves."""
    answers = {"body": SCRAPE}
    server = _server(lambda handler: _reply(handler, answers["body"]))
    server.answers = answers
    yield server
    server.shutdown()


def _settings(tmp_path, url):
    return Settings(data_dir=tmp_path, runtime="local", metrics_source="dcgm", metrics_dcgm_url=url)


def test_the_agent_reads_gpus_from_a_dcgm_exporter(tmp_path, monkeypatch, exporter):
    _entry_points_installed(tmp_path, monkeypatch)
    url = f"http://127.0.0.1:{exporter.server_address[1]}/metrics"
    source = sources.create_source(_settings(tmp_path, url))  # registered like the other sources
    assert isinstance(source, DcgmSource)
    agent = Agent("gpu-node-3", source, lambda: [Holding("j1", "alice", "lab", "default", (1,), 0.0)])
    server = agent.serve(0)
    agent.port = server.server_address[1]  # where _series scrapes the agent
    try:
        agent.sample_once()
        util = {dict(k)["gpu"]: v for k, v in _series(agent, "caldera_gpu_utilisation_percent").items()}
        assert util == {"0": 0.0, "1": 87.0}  # the MIG instance of device 2 is no whole device
        (labels,) = [dict(k) for k in _series(agent, "caldera_gpu_utilisation_percent") if dict(k)["gpu"] == "1"]
        assert labels == {"node": "gpu-node-3", "gpu": "1", "gpu_model": "a100"}
        used = {dict(k)["gpu"]: v for k, v in _series(agent, "caldera_gpu_memory_used_bytes").items()}
        total = {dict(k)["gpu"]: v for k, v in _series(agent, "caldera_gpu_memory_total_bytes").items()}
        assert used["1"] == 38464 * MIB and total["1"] == total["0"] == (38464 + 42530 + 566) * MIB
        assert set(_series(agent, "caldera_gpu_power_watts").values()) == {61.827, 312.54}
        prof = {(dict(k)["gpu"], dict(k)["field"]): v for k, v in _series(agent, "caldera_gpu_profiling_ratio").items()}
        assert prof[("1", "sm_active")] == 0.84321 and prof[("1", "sm_occupancy")] == 0.402117
        assert prof[("1", "dram_active")] == 0.558932 and prof[("1", "pcie_rx_bytes")] == 1831475200
        job = {dict(k)["job"]: v for k, v in _series(agent, "caldera_job_gpu_utilisation_percent").items()}
        assert job == {"j1": 87.0}  # the device the job holds, attributed as with NVML

        exporter.answers["body"] = b"<html>not the exporter</html>\x00"  # garbage: a round without GPU series
        agent.sample_once()
        assert _series(agent, "caldera_gpu_utilisation_percent") == {}
    finally:
        server.shutdown()


def test_an_exporter_that_is_not_there_gives_no_samples_and_no_url_no_source(tmp_path):
    with pytest.raises(SourceUnavailable, match="metrics_dcgm_url"):
        DcgmSource(Settings(data_dir=tmp_path, runtime="local"))
    import socket

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}/metrics"
    assert DcgmSource(_settings(tmp_path, url)).sample([], 0.0) == []
