"""Preemption: guarantee reclaim, best-effort, priority within a queue, soon-free capacity, holds, the cap."""

from __future__ import annotations

from caldera.core.tenancy import QueueConfig, Quota
from caldera.scheduler.caldera_policy import CalderaPolicy
from tests.builders import NOW, check_decisions, job, nodes, running, snapshot


def Q(name, guarantee=0.0, deserved=None, capability=None):
    return QueueConfig(
        name=name, account=name, quotas={"gpu": Quota(guarantee=guarantee, deserved=deserved, capability=capability)}
    )


def policy(**kw):
    kw.setdefault("starvation_threshold_s", None)
    return CalderaPolicy(**kw)


def _b_fills_cluster():
    # queue b holds all 16 GPUs; by priority and age: low-young, low-old, normal-young, normal-old
    return [
        running("b-low-old", {"n0": range(4)}, queue="b", priority="low", started_at=NOW - 2000),
        running("b-normal-young", {"n0": range(4, 8)}, queue="b", started_at=NOW - 10),
        running("b-low-young", {"n1": range(4)}, queue="b", priority="low", started_at=NOW - 100),
        running("b-normal-old", {"n1": range(4, 8)}, queue="b", started_at=NOW - 1000),
    ]


def test_guarantee_reclaim_preempts_lowest_priority_youngest_and_names_it():
    queues = [Q("a", guarantee=8), Q("b", guarantee=0, deserved=4)]
    snap = snapshot(nodes(2), [job("a1", 4, queue="a")], _b_fills_cluster(), queues)
    d = policy()(snap)
    check_decisions(snap, d)
    assert [(p.job_id, p.by_job_id, p.reason) for p in d.preemptions] == [("b-low-young", "a1", "Reclaim")]
    msg = d.preemptions[0].message
    assert "b-low-young" in msg and "a1" in msg and "queue a" in msg and "queue b" in msg
    assert "below its gpu guarantee" in msg and "above its deserved share" in msg
    r = d.pending["a1"][0]
    assert r.code == "WaitingForPreemption" and r.details["victims"] == ["b-low-young"]
    assert not d.starts


def test_reclaim_never_takes_a_queue_below_its_own_guarantee():
    queues = [Q("a", guarantee=8), Q("b", guarantee=12, deserved=12)]
    snap = snapshot(
        nodes(2),
        [job("a1", 4, queue="a", queued_since=NOW - 20), job("a2", 4, queue="a", queued_since=NOW - 10)],
        _b_fills_cluster(),
        queues,
    )
    d = policy()(snap)
    assert [p.job_id for p in d.preemptions] == ["b-low-young"]  # 16 -> 12 = b's guarantee
    assert d.pending["a2"][0].code == "GangNoFit"


def test_no_reclaim_beyond_the_claimers_guarantee_or_from_a_queue_within_its_share():
    queues = [Q("a", guarantee=2), Q("b", deserved=4)]
    snap = snapshot(nodes(2), [job("a1", 4, queue="a")], _b_fills_cluster(), queues)
    assert not policy()(snap).preemptions  # a would go above its guarantee of 2
    queues = [Q("a", guarantee=8), Q("b", deserved=16)]
    snap = snapshot(nodes(2), [job("a1", 4, queue="a")], _b_fills_cluster(), queues)
    assert not policy()(snap).preemptions  # b is within its deserved share


def test_best_effort_goes_first_even_when_reclaim_is_possible():
    queues = [Q("a", guarantee=8), Q("b", deserved=4), Q("c")]
    run = _b_fills_cluster()[:3] + [running("c-be", {"n1": range(4, 8)}, queue="c", priority="best-effort")]
    snap = snapshot(nodes(2), [job("a1", 4, queue="a")], run, queues)
    d = policy()(snap)
    assert [(p.job_id, p.reason) for p in d.preemptions] == [("c-be", "BestEffort")]
    assert "best-effort" in d.preemptions[0].message and "a1" in d.preemptions[0].message


def test_best_effort_runs_only_on_idle_capacity_and_never_preempts():
    run = [running("busy", {"n0": range(8)}, priority="low")]
    snap = snapshot(nodes(1), [job("be", 1, priority="best-effort")], run)
    d = policy()(snap)
    assert not d.preemptions and not d.starts
    r = d.pending["be"][0]
    assert r.code == "BestEffortNoIdle" and "idle capacity" in r.message
    snap = snapshot(nodes(1), [job("be", 1, priority="best-effort")])
    assert [s.job_id for s in policy()(snap).starts] == ["be"]


def test_anyone_preempts_best_effort_across_queues():
    run = [running("be", {"n0": range(8)}, queue="other", priority="best-effort")]
    snap = snapshot(nodes(1), [job("low", 2, priority="low")], run)
    d = policy()(snap)
    assert [(p.job_id, p.by_job_id, p.reason) for p in d.preemptions] == [("be", "low", "BestEffort")]


def test_higher_priority_preempts_lower_in_the_same_queue_only():
    run = [
        running("mine-low", {"n0": range(8)}, queue="q", priority="low"),
        running("other-low", {"n1": range(8)}, queue="other", priority="low", started_at=NOW - 1),
    ]
    snap = snapshot(nodes(2), [job("hi", 8, queue="q", priority="high")], run)
    d = policy()(snap)
    assert [(p.job_id, p.reason) for p in d.preemptions] == [("mine-low", "Priority")]
    assert "higher-priority" in d.preemptions[0].message
    assert not policy(priority_preemption=False)(snap).preemptions


def test_terminating_victims_count_as_soon_free_and_nothing_more_is_preempted():
    run = [
        running("victim", {"n0": range(4)}, priority="low", terminating=True, preempted_by="hi"),
        running("low2", {"n0": range(4, 8)}, priority="low"),
    ]
    snap = snapshot(nodes(1), [job("hi", 4, priority="high")], run)
    d = policy()(snap)
    check_decisions(snap, d)
    assert not d.preemptions
    r = d.pending["hi"][0]
    assert r.code == "WaitingForPreemption" and r.details["victims"] == ["victim"]
    assert r.details["new_preemptions"] == []


def test_soon_free_for_one_job_is_not_taken_by_another():
    run = [
        running("victim", {"n0": range(4)}, priority="low", terminating=True, preempted_by="hi"),
        running("low2", {"n0": range(4, 8)}, priority="low"),
    ]
    snap = snapshot(
        nodes(1),
        [job("hi", 4, priority="high", queued_since=NOW - 5), job("other", 4, priority="high", queued_since=NOW - 50)],
        run,
    )
    d = policy(priority_preemption=False)(snap)
    assert d.pending["hi"][0].code == "WaitingForPreemption"
    assert d.pending["other"][0].code == "GangNoFit"


def test_cancelled_job_resources_wait_for_the_first_job_that_needs_them():
    run = [running("cancelled", {"n0": range(8)}, terminating=True)]
    snap = snapshot(nodes(1), [job("j1", 4, queued_since=NOW - 20), job("j2", 4, queued_since=NOW - 10)], run)
    d = policy()(snap)
    assert not d.preemptions
    assert d.pending["j1"][0].code == "WaitingForPreemption"
    assert d.pending["j2"][0].code == "WaitingForPreemption"  # the other half of the node
    snap = snapshot(nodes(1), [job("j1", 8, queued_since=NOW - 20), job("j2", 4, queued_since=NOW - 10)], run)
    d = policy()(snap)
    assert d.pending["j1"][0].code == "WaitingForPreemption" and d.pending["j2"][0].code == "GangNoFit"


def test_waiting_job_holds_the_free_part_of_its_placement():
    # n0: 2 free + a best-effort job on 2; n1 full. The 4-GPU job preempts and keeps the 2 free GPUs, so the small
    # job behind it does not take them.
    run = [
        running("be", {"n0": [0, 1]}, priority="best-effort"),
        running("keep", {"n0": [2, 3, 4, 5]}, priority="high"),
        running("full", {"n1": range(8)}, priority="high"),
    ]
    # n0 has GPUs 6, 7 free
    snap = snapshot(nodes(2), [job("big", 4, queued_since=NOW - 20), job("small", 1, queued_since=NOW - 10)], run)
    d = policy()(snap)
    check_decisions(snap, d)
    assert [p.job_id for p in d.preemptions] == ["be"]
    assert not d.starts
    assert d.pending["small"][0].code == "GangNoFit"


def test_preemption_cap_per_cycle():
    run = [running(f"low{i}", {f"n{i}": range(8)}, priority="low") for i in range(3)]
    snap = snapshot(nodes(3), [job(f"hi{i}", 8, priority="high", queued_since=NOW - 10 + i) for i in range(3)], run)
    assert len(policy()(snap).preemptions) == 3
    d = policy(max_preemptions_per_cycle=2)(snap)
    assert len(d.preemptions) == 2
    assert d.pending["hi2"][0].code == "GangNoFit"


def test_victims_spare_what_is_not_needed():
    # a 4-GPU job on a node with two low jobs of 2 and one of 4: the youngest-first walk would take the two small
    # ones first; only enough victims on one node are taken.
    run = [
        running("lo-a", {"n0": [0, 1]}, priority="low", started_at=NOW - 10),
        running("lo-b", {"n0": [2, 3]}, priority="low", started_at=NOW - 20),
        running("lo-c", {"n0": [4, 5, 6, 7]}, priority="low", started_at=NOW - 30),
    ]
    snap = snapshot(nodes(1), [job("hi", 4, priority="high")], run)
    d = policy()(snap)
    assert sorted(p.job_id for p in d.preemptions) == ["lo-a", "lo-b"]


def test_an_interactive_best_effort_job_is_preempted_only_to_reclaim_a_guarantee():
    session = [running("lab", {"n0": range(4)}, queue="b", priority="best-effort", interactive=True)]
    snap = snapshot(nodes(1, 4), [job("new", 4, queue="c")], session, [Q("b"), Q("c")])
    d = policy()(snap)
    check_decisions(snap, d)
    assert d.preemptions == []  # queue c has no guarantee: the session stays
    snap = snapshot(nodes(1, 4), [job("new", 4, queue="a")], session, [Q("a", guarantee=4), Q("b", deserved=0)])
    d = policy()(snap)
    check_decisions(snap, d)
    assert [(p.job_id, p.reason) for p in d.preemptions] == [("lab", "Reclaim")]
