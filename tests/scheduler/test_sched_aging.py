"""Bounded waiting (caldera_aging): a low or best-effort job that waited past its patience is treated as normal, so
a stream of normal work cannot keep it waiting for ever; high jobs and interactive jobs stay out of its reach."""

from __future__ import annotations

from caldera.scheduler.caldera_policy import CalderaPolicy
from tests.builders import NOW, check_decisions, job, nodes, running, snapshot

LONG = 20 * 3600.0  # GPU-seconds: past both default attained-service levels


def decide(snap, **kw):
    kw.setdefault("starvation_threshold_s", None)
    kw.setdefault("aging_threshold_s", 1800.0)  # patience 30 min, or twice the expected run time when longer
    kw.setdefault("aging_factor", 2.0)
    d = CalderaPolicy(**kw)(snap)
    check_decisions(snap, d)
    return d


def busy(**kw):
    """One 1-GPU node held by a long-running normal batch job."""
    return [running("long", {"n0": [0]}, attained_gpu_s=LONG, started_at=NOW - 7200, **kw)]


def test_a_best_effort_job_that_waited_past_its_patience_preempts_like_a_normal_one():
    young = job("be", priority="best-effort", queued_since=NOW - 600)
    assert decide(snapshot(nodes(1, 1), [young], busy())).preemptions == []
    old = job("be", priority="best-effort", queued_since=NOW - 1900)
    d = decide(snapshot(nodes(1, 1), [old], busy()))
    assert [(p.job_id, p.by_job_id, p.reason) for p in d.preemptions] == [("long", "be", "LeastAttainedService")]


def test_the_policy_asks_to_be_woken_when_a_job_will_be_promoted():
    young = job("be", priority="best-effort", queued_since=NOW - 600)
    low = busy(priority="low")  # a normal job of the same queue preempts it by class
    d = decide(snapshot(nodes(1, 1), [young], low), las_thresholds_gpu_s=None)
    assert d.preemptions == [] and d.wake_at == NOW - 600 + 1800  # patience: 30 min
    d = decide(snapshot(nodes(1, 1), [young], low, now=NOW + 1200), las_thresholds_gpu_s=None)
    assert [(p.job_id, p.reason) for p in d.preemptions] == [("long", "Priority")]


def test_patience_grows_with_the_expected_run_time():
    waiting = job("low", priority="low", queued_since=NOW - 3600)
    waiting.expected_runtime_s = 4 * 3600  # 2x that is 8 h: not yet starving after 1 h
    assert decide(snapshot(nodes(1, 1), [waiting], busy())).preemptions == []
    waiting.expected_runtime_s = 600
    assert len(decide(snapshot(nodes(1, 1), [waiting], busy())).preemptions) == 1


def test_a_promoted_job_takes_its_turn_among_normal_jobs_by_attained_service():
    old_low = job("low", priority="low", queued_since=NOW - 7200)
    veteran = job("normal", attained_gpu_s=LONG, queued_since=NOW - 60)
    d = decide(snapshot(nodes(1, 1), [veteran, old_low]))
    assert [s.job_id for s in d.starts] == ["low"]
    d = decide(snapshot(nodes(1, 1), [veteran, old_low]), aging_threshold_s=None)
    assert [s.job_id for s in d.starts] == ["normal"]  # without aging, strict classes


def test_high_and_interactive_jobs_are_never_its_victims_nor_overtaken():
    old = job("be", priority="best-effort", queued_since=NOW - 86400)
    assert decide(snapshot(nodes(1, 1), [old], busy(priority="high"))).preemptions == []
    assert decide(snapshot(nodes(1, 1), [old], busy(interactive=True))).preemptions == []
    high = job("high", priority="high", attained_gpu_s=LONG, queued_since=NOW - 5)
    d = decide(snapshot(nodes(1, 1), [old, high]))
    assert [s.job_id for s in d.starts] == ["high"]


def test_without_aging_a_best_effort_job_waits_however_long():
    old = job("be", priority="best-effort", queued_since=NOW - 30 * 86400)
    d = decide(snapshot(nodes(1, 1), [old], busy()), aging_threshold_s=None)
    assert d.preemptions == [] and d.starts == []


def test_a_promoted_job_keeps_its_promotion_while_it_runs():
    # started after waiting past its patience: a normal newcomer may not preempt it as if it were best-effort
    promoted = running("be", {"n0": [0]}, priority="best-effort", started_at=NOW - 60)
    promoted.queued_since = NOW - 60 - 3600
    newcomer = job("new")
    assert decide(snapshot(nodes(1, 1), [newcomer], [promoted])).preemptions == []
    started_at_once = running("be", {"n0": [0]}, priority="best-effort", started_at=NOW - 60)
    started_at_once.queued_since = NOW - 70
    got = decide(snapshot(nodes(1, 1), [newcomer], [started_at_once])).preemptions
    assert [(p.job_id, p.reason) for p in got] == [("be", "BestEffort")]
