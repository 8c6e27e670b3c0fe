"""Least-attained-service among best-effort jobs (``las_best_effort``): a best-effort batch job may preempt a
best-effort batch job in a higher attained-service level; never a job of a higher class, nor one that aging
promoted, nor an interactive job; and a promoted best-effort job takes best-effort jobs only by the same rule."""

from __future__ import annotations

from caldera.core.tenancy import PriorityClass
from caldera.scheduler.caldera_policy import CalderaPolicy
from tests.builders import NOW, check_decisions, job, nodes, running, snapshot

BE = PriorityClass.BEST_EFFORT
LONG = 2 * 3600.0  # GPU-seconds: past the first level (1 GPU-hour)


def preempted(snap, **kw):
    kw.setdefault("starvation_threshold_s", None)
    kw.setdefault("las_best_effort", True)  # off by default since issue 30's third round
    d = CalderaPolicy(**kw)(snap)
    check_decisions(snap, d)
    return [(p.job_id, p.by_job_id, p.reason) for p in d.preemptions], d


def full(priority=BE, **kw):
    """One 1-GPU node held by a job that has run two hours."""
    return [running("long", {"n0": [0]}, priority=priority, attained_gpu_s=LONG, started_at=NOW - LONG, **kw)]


def test_a_best_effort_job_preempts_a_best_effort_job_that_ran_long():
    got, d = preempted(snapshot(nodes(1, 1), [job("new", priority=BE)], full()))
    assert got == [("long", "new", "LeastAttainedService")]
    assert "attained" in d.preemptions[0].message and d.pending["new"][0].code == "WaitingForPreemption"
    assert preempted(snapshot(nodes(1, 1), [job("new", priority=BE)], full()), las_best_effort=False)[0] == []


def test_a_best_effort_job_does_not_preempt_one_that_aging_promoted():
    """The victim waited past the aging threshold (600 s) before it started, so it runs as normal."""
    promoted = full()
    promoted[0].queued_since = promoted[0].submitted_at = NOW - LONG - 1000
    assert preempted(snapshot(nodes(1, 1), [job("new", priority=BE)], promoted))[0] == []


def test_never_a_higher_class_nor_an_interactive_job_nor_one_of_the_same_level():
    for victim in (full(PriorityClass.NORMAL), full(PriorityClass.LOW), full(interactive=True)):
        assert preempted(snapshot(nodes(1, 1), [job("new", priority=BE)], victim))[0] == []
    same = job("new", priority=BE, attained_gpu_s=LONG)  # as much service as the victim: same level
    assert preempted(snapshot(nodes(1, 1), [same], full()))[0] == []
    interactive = job("new", priority=BE, interactive=True)  # an interactive job takes no part in LAS
    assert preempted(snapshot(nodes(1, 1), [interactive], full()))[0] == []


def test_a_normal_job_still_takes_a_best_effort_job_first():
    run = full() + [running("ls", {"n1": [0]}, attained_gpu_s=20 * 3600.0, started_at=NOW - 3600)]
    got, _ = preempted(snapshot(nodes(2, 1), [job("new")], run))
    assert got == [("long", "new", "BestEffort")]


def test_wake_when_a_running_best_effort_job_reaches_the_first_level():
    """Only time lets the waiting best-effort job preempt: the running one becomes its victim at 1 GPU-hour."""
    run = [running("be", {"n0": [0]}, priority=BE, attained_gpu_s=600.0, started_at=NOW - 600)]
    snap = snapshot(nodes(1, 1), [job("new", priority=BE)], run)
    got, d = preempted(snap, aging_threshold_s=None)
    assert got == [] and d.wake_at == NOW + 3000


def test_a_promoted_best_effort_job_takes_best_effort_jobs_only_by_attained_service():
    """Aging promoted the waiting job (it waited past 600 s): it may preempt a best-effort job in a higher level,
    not one in its own or a lower level, which could preempt it straight back."""
    promoted = job("old", priority=BE, attained_gpu_s=LONG, queued_since=NOW - 1000)
    young = [running("young", {"n0": [0]}, priority=BE, attained_gpu_s=60.0, started_at=NOW - 60)]
    assert preempted(snapshot(nodes(1, 1), [promoted], young))[0] == []
    assert preempted(snapshot(nodes(1, 1), [promoted], young), las_best_effort=False)[0] == [
        ("young", "old", "BestEffort")
    ]
    longer = [running("longer", {"n0": [0]}, priority=BE, attained_gpu_s=20 * 3600.0, started_at=NOW - 72000)]
    assert preempted(snapshot(nodes(1, 1), [promoted], longer))[0] == [("longer", "old", "BestEffort")]
    normal = job("normal", attained_gpu_s=LONG)  # a normal job takes any best-effort job, as before
    assert preempted(snapshot(nodes(1, 1), [normal], young))[0] == [("young", "normal", "BestEffort")]


def test_a_promoted_best_effort_job_still_takes_a_best_effort_job_that_opted_out():
    """A job out of least-attained-service cannot take the promoted one back: it stays a best-effort victim."""
    promoted = job("old", priority=BE, attained_gpu_s=LONG, queued_since=NOW - 1000)
    out = [running("out", {"n0": [0]}, priority=BE, attained_gpu_s=60.0, started_at=NOW - 60)]
    out[0].las = False
    assert preempted(snapshot(nodes(1, 1), [promoted], out))[0] == [("out", "old", "BestEffort")]
