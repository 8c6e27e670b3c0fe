"""The Kubernetes runtime against the real test cluster (kube-apiserver, Kueue, kwok GPU nodes): a job is a
suspended Job that Kueue admits and kwok runs; a new runtime (the server after a restart) finds it again by its
labels alone and can stop it; nodes come from the cluster."""

from __future__ import annotations

from caldera.runtime.base import Handle, Phase
from caldera.runtime.kubernetes import manifests as m
from tests.k8s.conftest import add_queue, launch_request
from tests.runtime.conftest import wait_for


def test_a_job_admitted_by_kueue_runs_and_a_restarted_runtime_finds_it_by_its_labels(k8s_cluster, make_rt, account):
    add_queue(k8s_cluster.api_client, account, "main", {"gpu/a100": {"guarantee": 8}})
    rt = make_rt()
    req = launch_request(account, "main", resources={"gpu": 2, "gpu_model": "a100"})
    handle = rt.launch(req)
    job = rt.batch.read_namespaced_job(handle.data["name"], handle.data["namespace"])
    assert job.metadata.labels[m.LABEL_JOB] == req.job_id and job.metadata.labels[m.KUEUE_QUEUE] == "main"
    assert job.metadata.labels[m.LABEL_USER] == "alice" and handle.data["namespace"] == f"caldera-{account}"
    wait_for(lambda: rt.observe(handle).phase is Phase.RUNNING, 60, what="Kueue to admit and kwok to run the pod")
    [pod] = rt.pods.get((req.job_id, "1"))
    assert pod["spec"]["nodeName"] in {"gpu-node-0", "gpu-node-1"}  # the a100 nodes
    assert pod["spec"]["securityContext"]["runAsUser"] == 200_001 and not pod["spec"]["automountServiceAccountToken"]
    wait_for(lambda: rt.why_pending(handle) == [], 30, what="Kueue to see every pod ready")

    rt.close()
    again = make_rt()  # a restarted server: nothing but the cluster's labels tell it what runs
    found = wait_for(lambda: [h for h in again.attached() if h.job_id == req.job_id], 30, what="re-attach")
    assert found[0].data["namespace"] == handle.data["namespace"] and found[0].data["name"] == handle.data["name"]
    bare = Handle(req.job_id, 1, {})  # the server stopped while the launch was in flight: no handle data at all
    assert wait_for(lambda: again.observe(bare).phase is Phase.RUNNING, 30, what="observe after restart")
    again.stop(found[0], 0)
    obs = wait_for(lambda: (o := again.observe(found[0])).phase is Phase.FAILED and o, 60, what="stopped")
    assert obs.reason == "Stopped"


def test_nodes_come_from_the_cluster_with_their_gpus(k8s_cluster, make_rt):
    nodes = {n.name: n for n in make_rt().nodes()}
    assert len(nodes) == k8s_cluster.nodes
    assert [d.model for d in nodes["gpu-node-0"].gpus] == ["a100"] * 8
    assert [d.model for d in nodes["gpu-node-3"].gpus] == ["h100"] * 8
    assert nodes["gpu-node-0"].cpu == 64 and nodes["gpu-node-0"].memory_mib == 512 * 1024
