"""The Kubernetes runtime against a real API server (kwok nodes, Kueue): the cluster of tests/k8s/conftest.py's
``k8s_cluster`` fixture, or any cluster whose kubeconfig CALDERA_TEST_KUBECONFIG names; skipped without one."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from caldera.config import Settings
from caldera.core.spec import JobSpec
from caldera.runtime.base import LaunchRequest, Phase, RunAs
from caldera.runtime.kubernetes import manifests as m
from caldera.runtime.kubernetes.runtime import KubernetesRuntime
from caldera.runtime.kubernetes.settings import KubernetesSettings
from tests.runtime.conftest import wait_for

pytestmark = pytest.mark.k8s
pytest.importorskip("kubernetes")


@pytest.fixture
def kubeconfig(request) -> Path:
    try:
        return Path(request.getfixturevalue("k8s_cluster").kubeconfig)
    except pytest.FixtureLookupError:
        pass
    path = os.environ.get("CALDERA_TEST_KUBECONFIG")
    if not path:
        pytest.skip("no Kubernetes cluster (k8s_cluster fixture or CALDERA_TEST_KUBECONFIG)")
    return Path(path)


@pytest.fixture
def make_rt(kubeconfig: Path, tmp_path: Path):
    made: list[KubernetesRuntime] = []

    def _make() -> KubernetesRuntime:
        rt = KubernetesRuntime(Settings(data_dir=tmp_path / "data"), KubernetesSettings(kubeconfig=kubeconfig))
        made.append(rt)
        return rt

    yield _make
    for rt in made:
        rt.close()


def _req(**spec) -> LaunchRequest:
    job_id = uuid.uuid4().hex[:12]
    spec.setdefault("name", "t")
    spec.setdefault("command", ["true"])
    return LaunchRequest(
        job_id,
        1,
        JobSpec(**spec),
        (),
        Path("/w"),
        env={"CALDERA_ACCOUNT": "physics", "CALDERA_QUEUE": "default"},
        run_as=RunAs("alice", 200_001, 200_001),
    )


def test_a_job_is_created_suspended_with_its_labels_and_found_again_by_a_new_runtime(make_rt):
    rt = make_rt()
    req = _req()
    handle = rt.launch(req)
    job = rt.batch.read_namespaced_job(handle.data["name"], handle.data["namespace"])
    assert job.metadata.labels[m.LABEL_JOB] == req.job_id and job.metadata.labels[m.KUEUE_QUEUE] == "default"
    assert wait_for(lambda: rt.observe(handle).phase is not Phase.LOST, 10, what="the watch to see the job")
    again = make_rt()  # a restarted server
    found = wait_for(lambda: [h for h in again.attached() if h.job_id == req.job_id], 10, what="re-attach")
    assert found[0].data["namespace"] == handle.data["namespace"] and found[0].data["name"] == handle.data["name"]
    again.stop(found[0], 0)
    assert wait_for(lambda: again.observe(found[0]).phase is Phase.FAILED, 30, what="stopped").reason == "Stopped"


def test_nodes_come_from_the_cluster_with_their_gpus(make_rt):
    nodes = make_rt().nodes()
    assert nodes and any(n.gpus for n in nodes)


def test_a_distributed_job_has_its_headless_service(make_rt):
    rt = make_rt()
    handle = rt.launch(_req(kind="distributed", replicas=2, resources={"gpu": 8}))
    svc = rt.core.read_namespaced_service(handle.data["name"], handle.data["namespace"])
    assert svc.spec.cluster_ip == "None"
    rt.stop(handle, 0)
