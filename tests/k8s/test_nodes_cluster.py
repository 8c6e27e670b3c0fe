"""`caldera nodes` and the admin node page show what the cluster runs (issue 23, finding 5): which Caldera job
holds which node's GPUs (from the pod watch; Kueue and kube-scheduler place, so Caldera allocates nothing), and
pods Caldera did not start as "other"."""

from __future__ import annotations

import uuid

from kubernetes import client

from caldera.runtime.base import OTHER_HOLDER
from tests.k8s.conftest import put_queue
from tests.runtime.conftest import wait_for
from tests.test_runs import _submit, _until


def _holders(k, headers) -> dict[str, list]:
    nodes = k.api.client.get("/api/v1/nodes", headers=headers).json()
    return {n["name"]: [g["job"] for g in n["gpus"]] for n in nodes}


def test_nodes_show_calderas_jobs_and_other_pods_on_the_cluster(k8s_cluster, platform_on_k8s):
    k = platform_on_k8s
    queue = f"{k.account}-q"
    put_queue(k, queue, {"gpu": {"guarantee": 8, "capability": 8}})
    alice = k.api.user(k.admin, "alice", accounts=[k.account])
    bob = k.api.user(k.admin, "bob", accounts=[k.account])
    jid = _submit(
        k.api, alice, name="held", queue=queue, command=["sleep", "600"], resources={"gpu": 2, "gpu_model": "a100"}
    )
    _until(k.api, alice, jid, {"Running"})
    [node] = {p["spec"]["nodeName"] for p in k.runtime.pods.get((jid, "1"))}

    core = client.CoreV1Api(k8s_cluster.api_client)
    ns = f"other-{uuid.uuid4().hex[:6]}"  # another tenant of the cluster, not Caldera's
    core.create_namespace({"metadata": {"name": ns}})
    gpus = {"nvidia.com/gpu": "3"}
    pod = {
        "metadata": {"name": "theirs"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": "gpu-node-3"},
            "containers": [{"name": "c", "image": "x", "resources": {"requests": gpus, "limits": gpus}}],
        },
    }
    core.create_namespaced_pod(ns, pod)
    try:
        seen = wait_for(
            lambda: (h := _holders(k, k.admin))["gpu-node-3"].count(OTHER_HOLDER) >= 3 and h,
            60,
            what="the other tenant's pod on gpu-node-3",
        )
        assert seen[node].count(jid) == 2  # the admin sees whose
        assert _holders(k, alice)[node].count(jid) == 2  # so does its owner
        theirs = _holders(k, bob)[node]
        assert jid not in theirs and theirs.count("busy") >= 2  # anyone else: busy, not by id
    finally:
        core.delete_namespace(ns)
        assert k.api.client.post(f"/api/v1/jobs/{jid}/cancel", headers=alice).status_code == 200
