"""Caldera's queues as Kueue objects, against the real test cluster: admission within the guarantee (nominalQuota),
waiting with Kueue's reason over it, borrowing within the cohort up to the capability (borrowingLimit), and a sync
that is idempotent and removes queues Caldera no longer has."""

from __future__ import annotations

import time
import uuid
from typing import Any

from caldera.core.tenancy import QueueConfig
from caldera.runtime.kubernetes import kueue
from tests.conftest import wait_for

MODELS = ["a100", "h100"]


def _job(namespace: str, queue: str, gpus: int) -> dict[str, Any]:
    name = f"j-{uuid.uuid4().hex[:8]}"
    resources = {"cpu": "1", "memory": "1Gi", kueue.GPU_RESOURCE: str(gpus)}
    pod = {
        "metadata": {"annotations": {}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "nodeSelector": {kueue.GPU_MODEL_LABEL: "a100"},
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"requests": resources, "limits": resources}}
            ],
        },
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": {kueue.QUEUE_NAME_LABEL: queue}},
        "spec": {"suspend": True, "parallelism": 1, "completions": 1, "backoffLimit": 0, "template": pod},
    }


def _submit(api_client: Any, job: dict[str, Any]) -> str:
    from kubernetes import client

    client.BatchV1Api(api_client).create_namespaced_job(job["metadata"]["namespace"], job)
    return job["metadata"]["name"]


def _workload(api_client: Any, namespace: str, job_name: str, timeout: float = 30) -> dict[str, Any]:
    """The Workload Kueue made for the Job (found by its owner reference)."""
    from kubernetes.dynamic import DynamicClient

    res = DynamicClient(api_client).resources.get(api_version=kueue.API_VERSION, kind="Workload")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for wl in res.get(namespace=namespace).to_dict()["items"]:
            owners = wl["metadata"].get("ownerReferences") or []
            if any(o["kind"] == "Job" and o["name"] == job_name for o in owners) and wl.get("status"):
                return wl
        time.sleep(0.3)
    raise AssertionError(f"no Workload with a status for job {job_name}")


def _wait_reasons(api_client: Any, namespace: str, job_name: str, want: set[str], timeout: float = 30) -> list:
    deadline = time.monotonic() + timeout
    reasons: list = []
    while time.monotonic() < deadline:
        reasons = kueue.workload_reasons(_workload(api_client, namespace, job_name))
        if {r.code for r in reasons} == want:
            return reasons
        time.sleep(0.3)
    raise AssertionError(f"job {job_name}: reasons {reasons}, wanted codes {want}")


def _running_pods(api_client: Any, namespace: str, job_name: str) -> list:
    from kubernetes import client

    pods = client.CoreV1Api(api_client).list_namespaced_pod(namespace, label_selector=f"job-name={job_name}").items
    return [p for p in pods if p.status.phase == "Running"]


def _wait_running(api_client: Any, namespace: str, job_name: str, timeout: float = 30) -> list:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pods = _running_pods(api_client, namespace, job_name)
        if pods:
            return pods
        time.sleep(0.3)
    raise AssertionError(f"job {job_name} has no running pod")


def test_within_guarantee_admitted_and_over_it_waits_with_kueues_reason(k8s_cluster, account: str) -> None:
    api = k8s_cluster.api_client
    queue = QueueConfig(name=f"{account}-q", account=account, quotas={"gpu/a100": {"guarantee": 4, "capability": 4}})
    kueue.sync(api, kueue.translate([queue], MODELS, cohort_per="account"))
    ns = kueue.namespace_for(account)

    first = _submit(api, _job(ns, queue.name, 4))
    assert _wait_reasons(api, ns, first, set()) == []
    pods = _wait_running(api, ns, first)
    # Kueue put the a100 flavor's node label on the pod and the scheduler placed it on an a100 node
    node = pods[0].spec.node_name
    assert node in {"gpu-node-0", "gpu-node-1"}

    second = _submit(api, _job(ns, queue.name, 2))
    [reason] = _wait_reasons(api, ns, second, {kueue.KUEUE_INSUFFICIENT_QUOTA})
    assert reason.details["kueue_reason"] == "Pending" and reason.details["condition"] == "QuotaReserved"
    assert kueue.GPU_RESOURCE in reason.message and "gpu-a100" in reason.message
    assert _running_pods(api, ns, second) == []


def test_borrowing_in_the_cohort_up_to_the_capability(k8s_cluster, account: str) -> None:
    api = k8s_cluster.api_client
    lender = QueueConfig(name=f"{account}-lend", account=account, quotas={"gpu/a100": {"guarantee": 6}})
    borrower = QueueConfig(
        name=f"{account}-borrow", account=account, quotas={"gpu/a100": {"guarantee": 2, "capability": 5}}
    )
    kueue.sync(api, kueue.translate([lender, borrower], MODELS, cohort_per="account"))
    ns = kueue.namespace_for(account)

    # 5 GPUs: 2 of its own and 3 borrowed from the idle lender of the same account's cohort
    big = _submit(api, _job(ns, borrower.name, 5))
    assert _wait_reasons(api, ns, big, set()) == []
    _wait_running(api, ns, big)
    # one more would go past the capability (borrowingLimit 3) although the lender still has 3 idle
    more = _submit(api, _job(ns, borrower.name, 1))
    [reason] = _wait_reasons(api, ns, more, {kueue.KUEUE_INSUFFICIENT_QUOTA})
    assert "gpu-a100" in reason.message
    # the lender can still use what it did not lend
    own = _submit(api, _job(ns, lender.name, 3))
    assert _wait_reasons(api, ns, own, set()) == []


def test_sync_is_idempotent_and_removes_queues_caldera_dropped(k8s_cluster, account: str) -> None:
    from kubernetes.dynamic import DynamicClient

    api = k8s_cluster.api_client
    keep = QueueConfig(name=f"{account}-keep", account=account, quotas={"gpu": {"guarantee": 1}})
    drop = QueueConfig(name=f"{account}-drop", account=account)
    objs = kueue.translate([keep, drop], MODELS, cohort_per="account")
    kueue.sync(api, objs)
    cqs = DynamicClient(api).resources.get(api_version=kueue.API_VERSION, kind="ClusterQueue")
    before = cqs.get(name=kueue.cluster_queue_name(keep.name))
    kueue.sync(api, objs)  # the same queues again: nothing changes (Kueue's own status updates aside)
    after = cqs.get(name=kueue.cluster_queue_name(keep.name))
    assert after.metadata.generation == before.metadata.generation and after.spec == before.spec

    deleted = kueue.sync(api, kueue.translate([keep], MODELS, cohort_per="account"))
    assert f"ClusterQueue/{kueue.cluster_queue_name(drop.name)}" in deleted
    assert f"LocalQueue/{drop.name}" in deleted
    # the delete is asynchronous: Kueue's resource-in-use finalizer holds the object until its controller releases it
    wait_for(
        lambda: kueue.cluster_queue_name(drop.name) not in {cq.metadata.name for cq in cqs.get().items},
        what="the dropped ClusterQueue to be gone",
    )
    assert kueue.cluster_queue_name(keep.name) in {cq.metadata.name for cq in cqs.get().items}
    assert kueue.sync(api, kueue.translate([keep], MODELS, cohort_per="account")) == []
