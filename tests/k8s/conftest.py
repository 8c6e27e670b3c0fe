"""The real test cluster (scripts/k8s/up: etcd, kube-apiserver, controller-manager, scheduler, kwok GPU nodes and
Kueue on 127.0.0.1), once per test session. Missing binaries are built from the Go module proxy (about 20-30
minutes on 2 cores the first time), never skipped: a test marked ``k8s`` that did not reach a cluster failed."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NODES = 4  # gpu-node-0, gpu-node-1 (a100), gpu-node-2, gpu-node-3 (h100), 8 GPUs each


@dataclass
class K8sCluster:
    kubeconfig: Path
    state_dir: Path
    api_client: object  # kubernetes.client.ApiClient
    nodes: int

    def kubectl(self, *args: str) -> str:
        cmd = [str(self.state_dir / "bin" / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args]
        return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "k8s_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.k8s)


@pytest.fixture(scope="session")
def k8s_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[K8sCluster]:
    from kubernetes import config

    state = tmp_path_factory.mktemp("k8s-state")
    up = subprocess.run(
        [sys.executable, str(REPO / "scripts/k8s/cluster.py"), "up", "--state-dir", str(state), "--nodes", str(NODES)],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    try:
        assert up.returncode == 0, f"scripts/k8s/up failed:\n{up.stderr[-4000:]}"
        kubeconfig = Path(up.stdout.strip().splitlines()[-1])
        api = config.new_client_from_config(config_file=str(kubeconfig))
        yield K8sCluster(kubeconfig=kubeconfig, state_dir=state, api_client=api, nodes=NODES)
        api.close()
    finally:
        subprocess.run([sys.executable, str(REPO / "scripts/k8s/cluster.py"), "down", "--state-dir", str(state)])
