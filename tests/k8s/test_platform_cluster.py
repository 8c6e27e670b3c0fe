"""Caldera's server (API, loop, SQLite) with the Kubernetes runtime on the real test cluster: /why shows Kueue's
reason; Kueue reclaiming quota another queue borrowed preempts that queue's job with Caldera's notice, and Caldera
records the preemption and requeues it; another user can neither see nor touch someone's job; after a server
restart the running job is found again by its labels."""

from __future__ import annotations

from caldera.runtime.base import Handle
from caldera.runtime.kubernetes import kueue
from caldera.runtime.kubernetes import manifests as m
from tests.k8s.conftest import put_queue
from tests.runtime.conftest import wait_for
from tests.test_runs import _state, _submit, _until

A100 = {"gpu": 8, "gpu_model": "a100"}


def _why(k, headers, jid) -> dict:
    k.tick()
    return k.api.client.get(f"/api/v1/jobs/{jid}/why", headers=headers).json()


def test_over_quota_why_shows_kueues_reason_and_flavor(k8s_cluster, platform_on_k8s):
    k = platform_on_k8s
    queue = f"{k.account}-q"
    put_queue(k, queue, {"gpu/a100": {"guarantee": 8, "capability": 8}})
    alice = k.api.user(k.admin, "alice", accounts=[k.account])
    first = _submit(k.api, alice, name="first", queue=queue, command=["sleep", "600"], resources=A100)
    _until(k.api, alice, first, {"Running"})
    second = _submit(
        k.api, alice, name="second", queue=queue, command=["sleep", "600"], resources={"gpu": 1, "gpu_model": "a100"}
    )

    def kueue_reason():
        why = _why(k, alice, second)
        return why if any(r["code"] == kueue.KUEUE_INSUFFICIENT_QUOTA for r in why["pending"]) else None

    why = wait_for(kueue_reason, 60, what="Kueue's reason in /why")
    assert why["state"] == "Starting"  # handed to the cluster, waiting in Kueue
    [reason] = why["pending"]
    assert reason["details"]["flavors"] == ["gpu-a100"] and reason["details"]["source"] == "kueue"
    for jid in (first, second):
        assert k.api.client.post(f"/api/v1/jobs/{jid}/cancel", headers=alice).status_code == 200
        _until(k.api, alice, jid, {"Cancelled"})


def test_kueue_reclaiming_lent_quota_preempts_with_the_notice_and_caldera_requeues(k8s_cluster, platform_on_k8s):
    k = platform_on_k8s
    lend, borrow = f"{k.account}-lend", f"{k.account}-borrow"
    put_queue(k, lend, {"gpu/a100": {"guarantee": 8}})
    put_queue(k, borrow, {"gpu/a100": {"guarantee": 0, "capability": 8}})
    alice = k.api.user(k.admin, "alice", accounts=[k.account])
    victim = _submit(k.api, alice, name="victim", queue=borrow, command=["sleep", "600"], resources=A100)
    _until(k.api, alice, victim, {"Running"})  # on 8 GPUs borrowed from the idle lender
    key = (victim, "1")
    [pod] = k.runtime.pods.get(key)
    assert pod["spec"]["terminationGracePeriodSeconds"] == 2  # the platform's preemption grace

    owner = _submit(k.api, alice, name="owner", queue=lend, command=["sleep", "600"], resources=A100)

    def notice():  # what the victim's pod shows its job as CALDERA_PREEMPT_NOTICE, while its grace runs
        k.tick()
        pods = k.runtime.pods.get(key)
        return next((p["metadata"].get("annotations", {}).get(m.NOTICE_ANNOTATION) for p in pods), None)

    text = wait_for(notice, 60, interval=0.02, what="the preemption notice on the victim's pod")
    assert text.startswith("preempted by Kueue: Preempted to accommodate a workload") and "\ndeadline: " in text
    assert "within the cohort" in text  # Kueue's why: reclaiming (fair sharing) what the borrower took

    requeued = _until(k.api, alice, victim, {"Starting"}, timeout=60)  # attempt 2, handed to Kueue again
    assert requeued["attempt"] == 2
    events = k.api.client.get(f"/api/v1/jobs/{victim}/events", headers=alice).json()
    assert [e["to"] for e in events][-3:] == ["Preempted", "Queued", "Starting"]
    assert events[-3]["reason"] == "Preempted" and "within the cohort" in events[-3]["message"]
    _until(k.api, alice, owner, {"Running"})
    # the lender keeps its guarantee: the requeued attempt waits for quota
    wait_for(
        lambda: any(r["code"] == kueue.KUEUE_INSUFFICIENT_QUOTA for r in _why(k, alice, victim)["pending"]),
        60,
        what="the requeued victim to wait for quota",
    )
    # the old attempt's Job is gone (its Workload deactivated first, so Kueue could not start it again)
    assert wait_for(lambda: k.runtime.jobs.get(key) == [], 30, what="the first attempt's Job to go")


def test_another_user_can_neither_see_nor_touch_the_job(k8s_cluster, platform_on_k8s):
    k = platform_on_k8s
    put_queue(k, k.account)  # the account's default queue
    alice = k.api.user(k.admin, "alice", accounts=[k.account])
    bob = k.api.user(k.admin, "bob")  # another account
    jid = _submit(k.api, alice, name="mine", command=["sleep", "600"], resources={"gpu": 1})
    _until(k.api, alice, jid, {"Running"})
    c = k.api.client
    for path in ("", "/why", "/events", "/logs"):
        assert c.get(f"/api/v1/jobs/{jid}{path}", headers=bob).status_code == 404, path
    assert c.post(f"/api/v1/jobs/{jid}/cancel", headers=bob).status_code == 404
    assert jid not in [j["id"] for j in c.get("/api/v1/jobs", headers=bob).json()]
    k.tick()
    assert _state(k.api, alice, jid)["state"] == "Running"
    pods = k.runtime.pods.get((jid, "1"))
    assert len(pods) == 1 and "deletionTimestamp" not in pods[0]["metadata"]
    # and the job itself has no credentials for the API server
    assert pods[0]["spec"]["automountServiceAccountToken"] is False


def test_after_a_server_restart_the_running_job_is_found_again_and_can_be_cancelled(
    k8s_cluster, platform_on_k8s, make_rt
):
    from caldera.server.loop import SchedulerLoop

    k = platform_on_k8s
    put_queue(k, k.account)
    alice = k.api.user(k.admin, "alice", accounts=[k.account])
    jid = _submit(k.api, alice, name="long", command=["sleep", "600"], resources={"gpu": 1})
    _until(k.api, alice, jid, {"Running"})

    platform = k.api.client.app.state.platform
    k.runtime.close()
    platform.runtime = make_rt(preempt_grace_s=platform.settings.preempt_grace_s)  # the restarted server's runtime
    loop = SchedulerLoop(platform)
    k.api.client.app.state.loop = loop
    loop.recover()
    events = k.api.client.get(f"/api/v1/jobs/{jid}/events", headers=alice).json()
    assert events[-1]["reason"] == "Reattached" and _state(k.api, alice, jid)["state"] == "Running"
    found = [h for h in platform.runtime.attached() if h.job_id == jid]
    assert found and isinstance(found[0], Handle)
    assert k.api.client.post(f"/api/v1/jobs/{jid}/cancel", headers=alice).status_code == 200
    _until(k.api, alice, jid, {"Cancelled"})


def test_queues_edited_through_the_api_reach_kueue(k8s_cluster, platform_on_k8s):
    from kubernetes.dynamic import DynamicClient

    k = platform_on_k8s
    name = f"{k.account}-edit"
    cqs = DynamicClient(k8s_cluster.api_client).resources.get(api_version=kueue.API_VERSION, kind="ClusterQueue")

    def a100_quota() -> str | None:
        try:
            cq = cqs.get(name=kueue.cluster_queue_name(name)).to_dict()
        except Exception:  # not there yet
            return None
        for group in cq["spec"]["resourceGroups"]:
            for flavor in group["flavors"]:
                if flavor["name"] == "gpu-a100":
                    return flavor["resources"][0]["nominalQuota"]
        return None

    put_queue(k, name, {"gpu/a100": {"guarantee": 2, "capability": 4}})
    k.api.client.app.state.loop.tick()
    assert str(a100_quota()) == "2"
    put_queue(k, name, {"gpu/a100": {"guarantee": 6, "capability": 8}})
    k.api.client.app.state.loop.tick()
    assert str(a100_quota()) == "6"


def test_a_node_cordoned_through_the_admin_api_is_cordoned_in_the_cluster(k8s_cluster, platform_on_k8s):
    from kubernetes import client

    k = platform_on_k8s
    core = client.CoreV1Api(k8s_cluster.api_client)
    node = "gpu-node-3"  # an h100 node: the other tests' jobs ask for a100s
    mallory = k.api.user(k.admin, f"mallory{k.account}")
    try:
        r = k.api.client.post(f"/api/v1/admin/nodes/{node}/cordon", json={"reason": "fan broken"}, headers=k.admin)
        assert r.status_code == 200, r.text
        assert core.read_node(node).spec.unschedulable is True
        assert not {n.name: n for n in k.runtime.nodes()}[node].schedulable  # and so Caldera sees it from the cluster
        # not an admin: refused, and the node stays cordoned
        assert k.api.client.post(f"/api/v1/admin/nodes/{node}/uncordon", headers=mallory).status_code == 403
        assert core.read_node(node).spec.unschedulable is True
        assert k.api.client.post(f"/api/v1/admin/nodes/{node}/uncordon", headers=k.admin).status_code == 200
        assert not core.read_node(node).spec.unschedulable
    finally:
        core.patch_node(node, {"spec": {"unschedulable": False}})


def test_drain_preempts_the_job_whose_pod_is_on_the_node_and_leaves_the_others(k8s_cluster, platform_on_k8s):
    from kubernetes import client

    k = platform_on_k8s
    core = client.CoreV1Api(k8s_cluster.api_client)
    put_queue(k, k.account, {"gpu/h100": {"guarantee": 16}})  # the two h100 nodes: the other tests ask for a100s
    alice = k.api.user(k.admin, "alice", accounts=[k.account])
    whole_node = {"gpu": 8, "gpu_model": "h100"}
    jobs = [_submit(k.api, alice, name=f"j{i}", command=["sleep", "600"], resources=whole_node) for i in range(2)]
    for jid in jobs:
        assert _until(k.api, alice, jid, {"Running"})["allocations"] == []  # placed by kube-scheduler, not Caldera
    node_of = {jid: k.runtime.pods.get((jid, "1"))[0]["spec"]["nodeName"] for jid in jobs}
    victim, bystander = jobs
    node = node_of[victim]
    assert node_of[bystander] != node
    try:
        r = k.api.client.post(f"/api/v1/admin/nodes/{node}/drain", json={"reason": "DIMM"}, headers=k.admin)
        assert r.status_code == 200 and r.json()["preempted"] == [victim], r.text
        assert core.read_node(node).spec.unschedulable is True

        def notice():  # what the victim's pod shows its job as CALDERA_PREEMPT_NOTICE, while its grace runs
            pods = k.runtime.pods.get((victim, "1"))
            return next((p["metadata"].get("annotations", {}).get(m.NOTICE_ANNOTATION) for p in pods), None)

        text = wait_for(notice, 30, interval=0.02, what="the drain's notice on the victim's pod")
        assert text.startswith(f"preempted: node {node} is drained by an admin: DIMM\ndeadline: ")
        requeued = _until(k.api, alice, victim, {"Starting"}, timeout=60)  # attempt 2, handed to Kueue again
        assert requeued["attempt"] == 2
        assert [e["to"] for e in requeued["events"]][-3:] == ["Preempted", "Queued", "Starting"]
        assert requeued["events"][-3]["reason"] == "NodeDrained"
        # the bystander runs on, its pod untouched; the requeued attempt finds no room off the drained node
        assert _state(k.api, alice, bystander)["state"] == "Running"
        [pod] = k.runtime.pods.get((bystander, "1"))
        assert "deletionTimestamp" not in pod["metadata"] and m.NOTICE_ANNOTATION not in pod["metadata"].get(
            "annotations", {}
        )
        assert wait_for(
            lambda: any(r["code"] == "Unschedulable" for r in _why(k, alice, victim)["pending"]),
            60,
            what="the requeued victim to wait for a node",
        )
    finally:
        core.patch_node(node, {"spec": {"unschedulable": False}})
        for jid in jobs:
            k.api.client.post(f"/api/v1/jobs/{jid}/cancel", headers=alice)
