"""`caldera agent` as a node of a cluster runs it: a process of its own beside `caldera up`, sampling the node's
(fake) GPUs and learning from the platform's API, with an admin's token, which job holds which of them."""

from __future__ import annotations

import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import httpx
import pytest
import typer
import yaml
from prometheus_client.parser import text_string_to_metric_families

from caldera.cli.main import app
from tests.conftest import free_port, wait_for
from tests.test_server_process import token, until

DAEMONSET = Path(__file__).resolve().parents[2] / "docs" / "k8s" / "caldera-agent.yaml"


def _held(port: int) -> dict[str, tuple[str, str]]:
    """job -> (gpu, user) of the agent's job GPU series (none while it is not listening yet)."""
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return {}
    return {
        s.labels["job"]: (s.labels["gpu"], s.labels["user"])
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "caldera_job_gpu_utilisation_percent"
    }


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_caldera_agent_attributes_its_nodes_gpus_to_the_platforms_jobs(server, tmp_path):
    admin = token(server)
    r = httpx.post(server.url + "/api/v1/jobs", json={"name": "hold", "command": "sleep 120", "resources": {"gpu": 1}},
                   headers=admin)  # fmt: skip
    assert r.status_code == 201, r.text
    jid = r.json()["id"]
    (allocation,) = until(server, admin, jid, {"Running"})["allocations"]
    port = free_port()
    env = {
        **server.env,
        "CALDERA_URL": server.url,
        "CALDERA_TOKEN": admin["Authorization"].removeprefix("Bearer "),
        "CALDERA_FAKE_GPUS": '[{"model": "a100"}, {"model": "a100"}]',
        "CALDERA_METRICS_INTERVAL_S": "1",
        "CALDERA_DATA_DIR": str(tmp_path / "agent"),
    }
    agent = subprocess.Popen(
        [sys.executable, "-m", "caldera.cli.main", "agent", "--node", "node-0", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        held = wait_for(lambda: _held(port), 30, what="the agent's job series")
        assert held == {jid: (str(allocation["gpus"][0]), "admin")}
        httpx.post(f"{server.url}/api/v1/jobs/{jid}/cancel", headers=admin)
        wait_for(lambda: _held(port) == {}, 30, what="the cancelled job's series gone")
    finally:
        agent.send_signal(signal.SIGTERM)
        out, _ = agent.communicate(timeout=15)
    assert agent.returncode == 0 and f"agent for node node-0 (fake) on http://127.0.0.1:{port}/metrics" in out, out


def test_the_daemonset_runs_the_agent_with_options_it_has():
    ds = yaml.safe_load(DAEMONSET.read_text())
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["caldera"] and container["args"][0] == "agent"
    command = typer.main.get_command(app).get_command(None, "agent")
    options = {o for p in command.params for o in p.opts}
    assert {a for a in container["args"] if a.startswith("--")} <= options
    assert "--host" in container["args"]  # the pod's IP: the cluster network, not every address of the node
    assert "nvidia.com/gpu" not in str(container["resources"])  # it watches GPUs, it holds none
