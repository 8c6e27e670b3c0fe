"""A job Kueue admits but no node fits is not requeued every pods-ready timeout forever (issue 23, finding 3): each
eviction in a row holds the next attempt back from Kueue for a growing delay, `why` says so with kube-scheduler's
Unschedulable message, and after the limit the next attempt is held until the cluster's nodes change."""

from __future__ import annotations

import dataclasses
import time

from caldera.runtime.base import Phase
from caldera.runtime.kubernetes import evictions
from caldera.runtime.kubernetes import manifests as m
from tests.k8s.conftest import add_queue, launch_request
from tests.runtime.conftest import wait_for


def _until_evicted(rt, handle) -> None:
    def evicted():
        rt.why_pending(handle)  # as the loop asks each cycle while the job waits
        obs = rt.observe(handle)
        return obs.phase is Phase.FAILED and obs

    obs = wait_for(evicted, 120, interval=0.5, what="Kueue's pods-ready timeout to evict the job")
    assert obs.reason == "Evicted", obs


def _queued_in_kueue(rt, handle) -> bool:
    [job] = rt.jobs.get((handle.job_id, str(handle.attempt)))
    return job["metadata"]["labels"][m.KUEUE_QUEUE] == "main"


def test_evictions_back_off_then_hold_until_the_nodes_change(k8s_cluster, make_rt, account):
    from kubernetes import client

    add_queue(k8s_cluster.api_client, account, "main")
    rt = make_rt(k8s={"eviction_backoff_s": 2, "evictions_before_hold": 2})
    req = launch_request(account, "main", resources={"cpu": 500})  # no quota on cpu: admitted; no node has 500
    first = rt.launch(req)
    _until_evicted(rt, first)

    second = rt.launch(dataclasses.replace(req, attempt=2))  # the platform requeues it
    [why] = rt.why_pending(second)
    assert why["code"] == evictions.EVICTION_BACKOFF and why["details"]["evictions"] == 1
    assert "Insufficient cpu" in why["message"], why  # kube-scheduler's word, kept from the evicted attempt
    assert not _queued_in_kueue(rt, second)
    wait_for(lambda: rt.observe(second) and _queued_in_kueue(rt, second), 30, what="the backoff to pass")
    _until_evicted(rt, second)

    third = rt.launch(dataclasses.replace(req, attempt=3))
    [why] = rt.why_pending(third)
    assert why["code"] == evictions.HELD_NO_NODE_FITS and why["details"]["evictions"] == 2
    assert "Insufficient cpu" in why["message"]
    deadline = time.monotonic() + 8  # held: not handed to Kueue, however often it is observed
    while time.monotonic() < deadline:
        assert rt.observe(third).phase is Phase.STARTING and not _queued_in_kueue(rt, third)
        time.sleep(0.5)
    # Kueue has it in a queue that does not exist: nothing admitted, no pod
    assert not any(
        (w.get("status") or {}).get("admission")
        for w in rt.workloads.get((third.data["namespace"], third.data["name"]))
    )
    assert rt.pods.get((req.job_id, "3")) == []

    core = client.CoreV1Api(k8s_cluster.api_client)
    change = {"metadata": {"labels": {"caldera.io/test-change": account}}}
    core.patch_node("gpu-node-0", change)  # the cluster changed: it goes to Kueue again
    try:
        wait_for(lambda: rt.observe(third) and _queued_in_kueue(rt, third), 30, what="the held job to be released")
        workload = lambda: rt._workload_of(rt.jobs.get((req.job_id, "3"))[0]) or {}  # noqa: E731
        wait_for(
            lambda: workload().get("spec", {}).get("queueName") == "main", 30, what="Kueue to move it to its queue"
        )
    finally:
        core.patch_node("gpu-node-0", {"metadata": {"labels": {"caldera.io/test-change": None}}})
        rt.stop(third, 0)
