"""``best_effort_grace_s``: a job that is not best-effort takes back GPUs lent to best-effort batch jobs only once it
has waited that long since it was queued; until then its ``GangNoFit`` reason says when, and the cycle wakes then.
``best_effort_grace_scope`` says whether it may preempt least-attained-service victims meanwhile; with
``las_promoted_best_effort`` off, a best-effort job that aging promoted makes no least-attained-service preemption."""

from __future__ import annotations

from dataclasses import replace

from caldera.core.tenancy import PriorityClass
from caldera.scheduler.caldera_policy import CalderaPolicy
from tests.builders import NOW, check_decisions, job, node, nodes, running, snapshot

BE = PriorityClass.BEST_EFFORT
LONG = 2 * 3600.0  # GPU-seconds: past the first attained-service level (1 GPU-hour)


def decide(snap, **kw):
    kw.setdefault("starvation_threshold_s", None)
    d = CalderaPolicy(**kw)(snap)
    check_decisions(snap, d)
    return [(p.job_id, p.by_job_id, p.reason) for p in d.preemptions], d


def borrowed(queued_since: float = NOW - 10):
    """One 1-GPU node lent to a best-effort job, and a normal job that waits for it."""
    run = [running("be", {"n0": [0]}, priority=BE, started_at=NOW - 60)]
    return snapshot(nodes(1, 1), [job("new", queued_since=queued_since)], run)


def test_the_borrower_keeps_its_gpu_until_the_grace_is_over():
    assert decide(borrowed(), best_effort_grace_s=0)[0] == [("be", "new", "BestEffort")]
    got, d = decide(borrowed(), best_effort_grace_s=900)
    assert got == []
    reason = d.pending["new"][0]
    assert reason.code == "GangNoFit" and reason.details["best_effort_grace_until"] == NOW - 10 + 900
    assert "taken back for it only from" in reason.message
    assert d.wake_at == NOW - 10 + 900  # nothing else would run a cycle before then
    got, _ = decide(borrowed(queued_since=NOW - 900), best_effort_grace_s=900)
    assert got == [("be", "new", "BestEffort")]


def las_and_borrower():
    """Two 1-GPU nodes: a best-effort job on n0, a normal job past the first attained-service level on n1."""
    run = [
        running("be", {"n0": [0]}, priority=BE, started_at=NOW - 60),
        running("long", {"n1": [0]}, attained_gpu_s=LONG, started_at=NOW - LONG),
    ]
    return nodes(2, 1), run


def test_the_scope_says_whether_a_least_attained_service_victim_is_taken_instead():
    node_list, run = las_and_borrower()
    snap = snapshot(node_list, [job("new")], run)
    assert decide(snap, best_effort_grace_s=0)[0] == [("be", "new", "BestEffort")]  # the borrower first
    assert decide(snap, best_effort_grace_s=900)[0] == [("long", "new", "LeastAttainedService")]
    assert decide(snap, best_effort_grace_s=900, best_effort_grace_scope="all")[0] == []
    got, d = decide(snapshot(node_list, [job("new", queued_since=NOW - 900)], run), best_effort_grace_s=900)
    assert got == [("be", "new", "BestEffort")] and d.pending["new"][0].code == "WaitingForPreemption"


def test_a_promoted_best_effort_job_makes_no_least_attained_service_preemption_when_told():
    """``las_promoted_best_effort=False``: a best-effort job that aging promoted (it waited past 300 s) takes free
    GPUs and best-effort jobs only, not a normal job with more attained service, which a normal job still takes."""
    run = [running("long", {"n0": [0]}, attained_gpu_s=LONG, started_at=NOW - LONG)]
    promoted = snapshot(nodes(1, 1), [job("old", priority=BE, queued_since=NOW - 1000)], run)
    assert decide(promoted)[0] == [("long", "old", "LeastAttainedService")]
    assert decide(promoted, las_promoted_best_effort=False)[0] == []
    normal = snapshot(nodes(1, 1), [job("new", queued_since=NOW - 1000)], run)
    assert decide(normal, las_promoted_best_effort=False)[0] == [("long", "new", "LeastAttainedService")]


def test_a_promoted_best_effort_job_that_may_not_preempt_leaves_the_victim_to_the_normal_job_behind_it():
    """The promoted job comes first (it waited longer). It may take only the best-effort job, whose node has too few
    CPUs for it, and fails; a normal job of the same shape behind it still preempts the least-attained-service
    victim (a failure is remembered for the jobs that may take what it could, not for every job of its shape)."""
    node_list = [node("n0", 1, cpu=2.0), node("n1", 1)]
    run = [
        running("be", {"n0": [0]}, priority=BE, started_at=NOW - 60),
        running("long", {"n1": [0]}, attained_gpu_s=LONG, started_at=NOW - LONG),
    ]
    queued = [job("old", priority=BE, cpu=4.0, queued_since=NOW - 2000), job("new", cpu=4.0, queued_since=NOW - 1000)]
    got, _ = decide(snapshot(node_list, queued, run), las_promoted_best_effort=False)
    assert got == [("long", "new", "LeastAttainedService")]


def test_a_job_that_opted_out_of_least_attained_service_leaves_the_victim_to_the_batch_job_behind_it():
    """The same for an interactive job (``las`` False: it takes no least-attained-service victim), the default
    policy: before, its failed search was remembered for its shape, and the batch job behind it waited too."""
    node_list = [node("n0", 1, cpu=2.0), node("n1", 1)]
    run = [
        running("be", {"n0": [0]}, priority=BE, started_at=NOW - 60),
        running("long", {"n1": [0]}, attained_gpu_s=LONG, started_at=NOW - LONG),
    ]
    notebook = replace(job("notebook", cpu=4.0, interactive=True, queued_since=NOW - 2000), las=False)
    got, _ = decide(snapshot(node_list, [notebook, job("new", cpu=4.0, queued_since=NOW - 1000)], run))
    assert got == [("long", "new", "LeastAttainedService")]
