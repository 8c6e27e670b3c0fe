"""Why a job handed to the cluster does not run, from the cluster itself (the runtime's why_pending, which the
loop shows as /why): Kueue's reason from the job's Workload, naming the flavor that lacks quota, and kube-scheduler's
FailedScheduling event when Kueue admitted the job but no node can take a pod."""

from __future__ import annotations

from caldera.runtime.base import Phase
from caldera.runtime.kubernetes import kueue
from tests.k8s.conftest import add_queue, launch_request
from tests.runtime.conftest import wait_for


def _codes(rt, handle) -> set[str]:
    return {r["code"] for r in rt.why_pending(handle)}


def test_a_job_over_its_queues_quota_waits_with_kueues_insufficient_quota_naming_the_flavor(
    k8s_cluster, make_rt, account
):
    add_queue(k8s_cluster.api_client, account, "small", {"gpu/a100": {"guarantee": 4, "capability": 4}})
    rt = make_rt()
    first = rt.launch(launch_request(account, "small", resources={"gpu": 4, "gpu_model": "a100"}))
    wait_for(lambda: rt.observe(first).phase is Phase.RUNNING, 60, what="the first job to run")

    second = rt.launch(launch_request(account, "small", resources={"gpu": 2, "gpu_model": "a100"}))
    wait_for(lambda: _codes(rt, second) == {kueue.KUEUE_INSUFFICIENT_QUOTA}, 30, what="Kueue's reason")
    [reason] = rt.why_pending(second)
    assert reason["details"]["source"] == "kueue" and reason["details"]["condition"] == "QuotaReserved"
    assert reason["details"]["flavors"] == ["gpu-a100"] and reason["details"]["resources"] == ["nvidia.com/gpu"]
    assert reason["details"]["workload"]  # the Workload found by its owner reference to the Job
    assert rt.observe(second).phase is Phase.STARTING and rt.pods.get((second.job_id, "1")) == []

    rt.stop(first, 0)  # its quota comes back: Kueue admits the second one and the reasons go
    wait_for(lambda: rt.observe(second).phase is Phase.RUNNING, 60, what="the second job to run")
    wait_for(lambda: rt.why_pending(second) == [], 30, what="Kueue to see every pod ready")


def test_a_pod_no_node_can_take_shows_kube_schedulers_failed_scheduling_event(k8s_cluster, make_rt, account):
    add_queue(k8s_cluster.api_client, account, "cpu")  # no quota: Kueue admits anything, placement is the scheduler's
    rt = make_rt()
    handle = rt.launch(launch_request(account, "cpu", resources={"cpu": 100}))  # the nodes have 64 cores

    def scheduler_reason():
        return next((r for r in rt.why_pending(handle) if r["code"] == "Unschedulable"), None)

    reason = wait_for(scheduler_reason, 60, what="the FailedScheduling event")
    assert reason["details"]["source"] == "kube-scheduler" and "Insufficient cpu" in reason["message"]
    wait_for(lambda: reason_event(rt, handle), 30, what="the reason to come from the event")
    # admitted by Kueue (quota reserved) but not started: all-or-nothing waits for every pod to be ready
    assert kueue.KUEUE_WAITING_FOR_PODS_READY in _codes(rt, handle)
    assert rt.observe(handle).phase is Phase.STARTING
    rt.stop(handle, 0)


def reason_event(rt, handle) -> bool:
    return any(r["details"].get("event") == "FailedScheduling" for r in rt.why_pending(handle))
