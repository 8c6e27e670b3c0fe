"""A distributed job is one Kueue Workload of all its pods: admitted whole or not at all. Over its quota no pod
of it exists (not the half that would fit); once the quota is there every rank starts, each on its own node, with
rank 0 at the stable name MASTER_ADDR gives. Kueue's all-or-nothing start (waitForPodsReady): a gang admitted by
quota whose pods cannot all be placed is evicted whole, not left half running."""

from __future__ import annotations

import dataclasses
import time

from caldera.runtime.base import Phase
from caldera.runtime.kubernetes import kueue
from tests.k8s.conftest import add_queue, launch_request
from tests.runtime.conftest import wait_for


def _env(pod: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}


def test_a_gang_is_admitted_whole_or_not_at_all(k8s_cluster, make_rt, account):
    add_queue(k8s_cluster.api_client, account, "gang", {"gpu/a100": {"guarantee": 16, "capability": 16}})
    rt = make_rt()
    filler = rt.launch(launch_request(account, "gang", resources={"gpu": 8, "gpu_model": "a100"}))
    wait_for(lambda: rt.observe(filler).phase is Phase.RUNNING, 60, what="the filler job")

    # 2 x 8 GPUs: one replica would fit in what is left, the gang does not
    gang = rt.launch(
        launch_request(account, "gang", kind="distributed", replicas=2, resources={"gpu": 8, "gpu_model": "a100"})
    )
    wait_for(
        lambda: kueue.KUEUE_INSUFFICIENT_QUOTA in {r["code"] for r in rt.why_pending(gang)}, 30, what="Kueue's reason"
    )
    time.sleep(3)  # long enough for a partial start to show
    assert rt.pods.get((gang.job_id, "1")) == [] and rt.observe(gang).phase is Phase.STARTING

    rt.stop(filler, 0)
    wait_for(lambda: rt.observe(gang).phase is Phase.RUNNING, 60, what="the whole gang to run")
    pods = sorted(rt.pods.get((gang.job_id, "1")), key=lambda p: p["spec"]["hostname"])
    assert len(pods) == 2 and {p["spec"]["nodeName"] for p in pods} == {"gpu-node-0", "gpu-node-1"}
    name, ns = gang.data["name"], gang.data["namespace"]
    assert [p["spec"]["hostname"] for p in pods] == [f"{name}-0", f"{name}-1"]
    assert {p["spec"]["subdomain"] for p in pods} == {name}
    assert _env(pods[0])["MASTER_ADDR"] == f"{name}-0.{name}.{ns}.svc" and _env(pods[0])["WORLD_SIZE"] == "2"
    svc = rt.core.read_namespaced_service(name, ns)
    assert svc.spec.cluster_ip == "None"
    rt.stop(gang, 0)


def test_a_gang_admitted_by_quota_that_cannot_all_be_placed_is_evicted_whole(k8s_cluster, make_rt, account):
    add_queue(k8s_cluster.api_client, account, "free")  # no quota: Kueue admits, only the nodes limit it
    spec = {"kind": "distributed", "replicas": 2, "resources": {"gpu": 8, "gpu_model": "a100"}}
    rt = make_rt()
    k8s_cluster.kubectl("cordon", "gpu-node-1")
    try:
        req = launch_request(account, "free", **spec)
        gang = rt.launch(req)
        key = (gang.job_id, "1")

        def half_running():
            pods = rt.pods.get(key)
            return len(pods) == 2 and sorted(p["status"].get("phase") for p in pods) == ["Pending", "Running"]

        wait_for(half_running, 60, what="rank 0 on gpu-node-0, rank 1 with no a100 node left")
        want = {"Unschedulable", kueue.KUEUE_WAITING_FOR_PODS_READY}
        wait_for(lambda: want <= {r["code"] for r in rt.why_pending(gang)}, 30, what="the scheduler's and Kueue's why")
        assert rt.observe(gang).phase is Phase.STARTING  # never Running with half its ranks

        # Kueue's pods-ready timeout (30 s on the test cluster) evicts the Workload; the running rank is stopped
        # too, and the attempt ends for the platform to requeue (the loop does that for "Evicted")
        obs = wait_for(lambda: (o := rt.observe(gang)).phase is Phase.FAILED and o, 120, what="the eviction")
        assert obs.reason == "Evicted" and "PodsReady" in obs.message
        assert rt.pods.get(key) == []
    finally:
        k8s_cluster.kubectl("uncordon", "gpu-node-1")
    # the next attempt, as the loop launches it: with the node back the whole gang runs
    again = rt.launch(dataclasses.replace(req, attempt=2))
    wait_for(lambda: rt.observe(again).phase is Phase.RUNNING, 60, what="the next attempt to run whole")
    rt.stop(again, 0)
