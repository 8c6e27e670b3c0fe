"""The real test cluster (scripts/k8s/up: etcd, kube-apiserver, controller-manager, scheduler, kwok GPU nodes and
Kueue on 127.0.0.1), once per test session. Missing binaries are built from the Go module proxy (about 20-30
minutes on 2 cores the first time), never skipped: a test marked ``k8s`` that did not reach a cluster failed."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from email.message import Message
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


@pytest.fixture
def account(k8s_cluster: K8sCluster) -> Iterator[str]:
    """A fresh Caldera account, so its namespace (caldera-<account>) and queues are this test's alone; the
    namespace goes afterwards, so no pod of this test holds GPUs in the next one (once their grace is over)."""
    import uuid

    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from caldera.runtime.kubernetes import kueue

    name = f"acct{uuid.uuid4().hex[:6]}"
    yield name
    core = client.CoreV1Api(k8s_cluster.api_client)
    try:
        core.delete_namespace(kueue.namespace_for(name), propagation_policy="Background")
    except ApiException as e:
        if e.status != 404:
            raise


def add_queue(api_client: object, account: str, name: str, quotas: dict | None = None) -> None:
    """A Caldera queue as Kueue objects (ClusterQueue in the account's cohort, LocalQueue in its namespace); applied,
    never synced, so the other tests' queues on the shared cluster stay."""
    from caldera.core.tenancy import QueueConfig
    from caldera.runtime.kubernetes import kueue

    queue = QueueConfig(name=name, account=account, quotas=quotas or {})
    kueue.apply(api_client, kueue.translate([queue], ["a100", "h100"], cohort_per="account"))


@pytest.fixture
def make_rt(k8s_cluster: K8sCluster, tmp_path: Path):
    """KubernetesRuntime factory against the test cluster (a second call is the runtime after a server restart);
    the pods' grace is 3 s (kwok removes a deleted pod when its grace ends)."""
    from caldera.config import Settings
    from caldera.runtime.kubernetes.runtime import KubernetesRuntime
    from caldera.runtime.kubernetes.settings import KubernetesSettings

    made: list = []

    def _make(k8s: dict | None = None, **settings: object):
        settings.setdefault("preempt_grace_s", 3)
        rt = KubernetesRuntime(
            Settings(data_dir=tmp_path / "data", **settings),
            # cohorts per account, as add_queue makes them: the tests share one cluster
            KubernetesSettings(kubeconfig=k8s_cluster.kubeconfig, cohort_per="account", **(k8s or {})),
        )
        made.append(rt)
        return rt

    yield _make
    for rt in made:
        rt.close()


def launch_request(account: str, queue: str, attempt: int = 1, **spec: object):
    import uuid

    from caldera.core.spec import JobSpec
    from caldera.runtime.base import LaunchRequest, RunAs

    spec.setdefault("name", "t")
    spec.setdefault("command", ["true"])
    return LaunchRequest(
        uuid.uuid4().hex[:12],
        attempt,
        JobSpec(**spec),
        (),
        Path("/w"),
        env={"CALDERA_ACCOUNT": account, "CALDERA_QUEUE": queue},
        run_as=RunAs("alice", 200_001, 200_001),
    )


@dataclass
class K8sPlatform:
    api: object  # tests.conftest.Api
    admin: dict[str, str]
    runtime: object  # KubernetesRuntime
    account: str

    def tick(self) -> None:
        self.api.client.app.state.loop.tick()  # type: ignore[attr-defined]


@pytest.fixture
def platform_on_k8s(k8s_cluster: K8sCluster, make_rt, tmp_path: Path, account: str) -> Iterator[K8sPlatform]:
    """Caldera's server (API and loop, SQLite) with the Kubernetes runtime on the test cluster, the account
    ``account`` created through the API; the loop is driven by the test (tick)."""
    from tests.conftest import api_on, make_settings

    settings = make_settings(tmp_path, f"sqlite:///{tmp_path / 'caldera.db'}", run_jobs_as="server")
    rt = make_rt(preempt_grace_s=settings.preempt_grace_s)
    with api_on(settings, rt) as (api, admin):
        r = api.client.post("/api/v1/accounts", json={"name": account}, headers=admin)
        assert r.status_code == 201, r.text
        yield K8sPlatform(api, admin, rt, account)


def put_queue(k: K8sPlatform, name: str, quotas: dict | None = None) -> None:
    """The queue in Caldera (admin API); the loop's next cycle pushes it to Kueue."""
    body = {"account": k.account, "quotas": quotas or {}}
    r = k.api.client.put(f"/api/v1/queues/{name}", json=body, headers=k.admin)  # type: ignore[attr-defined]
    assert r.status_code == 200, r.text


Answer = Callable[[str, Message], tuple[int, dict[str, str], bytes]]


class StandIn(http.server.ThreadingHTTPServer):
    """A session's server where kwok runs none (Jupyter, code-server): it listens at the pod's IP and lab port
    (kwok gives pods loopback IPs), answers each GET with ``answer(path, headers)`` (status, headers, body), and
    keeps every request's path and headers (lower-case names) in ``seen``."""

    def __init__(self, host: str, port: int, answer: Answer):
        self.answer, self.seen = answer, []
        super().__init__((host, port), _StandInHandler)

    def start(self) -> StandIn:
        threading.Thread(target=self.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class _StandInHandler(http.server.BaseHTTPRequestHandler):
    server: StandIn

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.server.seen.append({"path": self.path, **{k.lower(): v for k, v in self.headers.items()}})
        status, headers, body = self.server.answer(self.path, self.headers)
        self.send_response(status)
        for name, value in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass
