"""Least-attained-service in the caldera policy: batch jobs with less service go first and may preempt batch jobs
with much more (of their own queue, or of queues above their deserved share); never interactive jobs, jobs that
opted out, jobs of a higher class, or jobs that only just started."""

from __future__ import annotations

import pytest

from caldera.core.tenancy import QueueConfig, Quota
from caldera.scheduler.caldera_policy import CalderaPolicy
from tests.builders import NOW, check_decisions, job, nodes, running, snapshot

LONG = 20 * 3600.0  # GPU-seconds: past both default levels (1 and 10 GPU-hours)


def policy(**kw):
    kw.setdefault("starvation_threshold_s", None)
    return CalderaPolicy(**kw)


def full(**kw):
    """One 2-GPU node held by an old, long-running batch job and a young one that attained little."""
    return [
        running("long", {"n0": [0]}, attained_gpu_s=LONG, started_at=NOW - 3600, **kw),
        running("short", {"n0": [1]}, attained_gpu_s=60, started_at=NOW - 60),
    ]


def preempted(snap, **kw):
    d = policy(**kw)(snap)
    check_decisions(snap, d)
    return [(p.job_id, p.by_job_id, p.reason) for p in d.preemptions], d


def test_a_new_job_preempts_the_job_with_the_most_attained_service():
    snap = snapshot(nodes(1, 2), [job("new")], full())
    got, d = preempted(snap)
    assert got == [("long", "new", "LeastAttainedService")]
    assert "attained" in d.preemptions[0].message and d.pending["new"][0].code == "WaitingForPreemption"


def test_no_preemption_without_las_or_between_equal_levels():
    assert preempted(snapshot(nodes(1, 2), [job("new")], full()), las_thresholds_gpu_s=None)[0] == []
    old = job("old", attained_gpu_s=LONG)  # as much service as the victim: same level
    assert preempted(snapshot(nodes(1, 2), [old], full()))[0] == []


def test_interactive_opted_out_and_just_started_jobs_are_not_preempted():
    interactive = full(interactive=True)
    assert preempted(snapshot(nodes(1, 2), [job("new")], interactive))[0] == []
    opted_out = full()
    opted_out[0].las = False
    assert preempted(snapshot(nodes(1, 2), [job("new")], opted_out))[0] == []
    young = full()
    young[0].started_at = NOW - 100  # ran less than las_min_run_s since its last start
    assert preempted(snapshot(nodes(1, 2), [job("new")], young), las_min_run_s=300)[0] == []
    assert preempted(snapshot(nodes(1, 2), [job("new")], young))[0] == [("long", "new", "LeastAttainedService")]


def test_a_waiting_job_that_opted_out_does_not_preempt_either():
    new = job("new")
    new.las = False
    assert preempted(snapshot(nodes(1, 2), [new], full()))[0] == []


def test_other_queues_only_when_above_their_deserved_share_when_asked():
    def q(name, deserved):
        return QueueConfig(name=name, account=name, quotas={"gpu": Quota(deserved=deserved)})

    other = full()
    for r in other:
        r.queue = "b"
    snap = snapshot(nodes(1, 2), [job("new", queue="a")], other, [q("a", 1), q("b", 2)])
    assert preempted(snap, las_across_queues="share")[0] == []  # b uses its 2 deserved GPUs: not above
    snap = snapshot(nodes(1, 2), [job("new", queue="a")], other, [q("a", 1.5), q("b", 0.5)])
    assert preempted(snap, las_across_queues="share")[0] == [("long", "new", "LeastAttainedService")]


def test_by_default_other_queues_only_keep_their_guarantee():
    def q(name, deserved, guarantee=0):
        return QueueConfig(name=name, account=name, quotas={"gpu": Quota(deserved=deserved, guarantee=guarantee)})

    other = full()
    for r in other:
        r.queue = "b"
    snap = snapshot(nodes(1, 2), [job("new", queue="a")], other, [q("a", 1), q("b", 2)])
    assert preempted(snap)[0] == [("long", "new", "LeastAttainedService")]  # within its share, but no guarantee
    snap = snapshot(nodes(1, 2), [job("new", queue="a")], other, [q("a", 1), q("b", 2, guarantee=2)])
    assert preempted(snap)[0] == []  # b would fall below its guarantee


def test_less_attained_service_goes_first_within_a_class():
    queued = [job("veteran", attained_gpu_s=LONG, queued_since=NOW - 500), job("newcomer", queued_since=NOW - 5)]
    d = policy()(snapshot(nodes(1, 1), queued))
    assert [s.job_id for s in d.starts] == ["newcomer"]


def test_wake_when_a_job_started_this_cycle_reaches_the_next_level():
    """Only time can let the waiting 2-GPU job preempt: the 1-GPU job started now reaches the first level (1
    GPU-hour) in an hour and becomes its victim then; no periodic cycle before that can do anything."""
    snap = snapshot(nodes(1, 2), [job("small", queued_since=NOW - 10), job("pair", 2, queued_since=NOW - 5)])
    d = policy()(snap)
    check_decisions(snap, d)
    assert [s.job_id for s in d.starts] == ["small"] and not d.preemptions
    assert d.wake_at == NOW + 3600


def test_no_wake_before_the_next_level_while_fair_share_moves():
    """A running batch job and a waiting one in the same (second) level: fair share may reorder the queue as usage
    decays, yet nobody can preempt anybody before the running job reaches the next level (10 GPU-hours)."""
    run = [running("a", {"n0": [0]}, attained_gpu_s=4000, started_at=NOW - 600, user="u1")]
    snap = snapshot(nodes(1, 1), [job("b", user="u2", attained_gpu_s=5000, queued_since=NOW - 60)], run)
    snap.user_usage = {"u1": 4000.0, "u2": 5000.0}
    d = policy(las_starvation_factor=None)(snap)
    assert not d.starts and not d.preemptions
    assert d.wake_at == NOW + 32000  # a reaches 36,000 GPU-s; then b preempts it
    # b, preempted before after 5,000 s on its GPU, starves after 3 x 5,000 s in the queue: then it may preempt a
    assert policy()(snap).wake_at == NOW - 60 + 15000


def test_within_a_level_less_attained_service_first():
    """Among jobs of one level the one with less service goes first (by default; ``within_level="fair_share"``:
    fair share, then first queued), even against a user with less recent usage."""
    queued = [
        job("more", user="light", attained_gpu_s=3000, queued_since=NOW - 500),
        job("less", user="heavy", queued_since=NOW - 5),
    ]
    snap = snapshot(nodes(1, 1), queued)
    snap.user_usage = {"heavy": 50_000.0, "light": 0.0}
    assert [s.job_id for s in policy()(snap).starts] == ["less"]
    assert [s.job_id for s in policy(within_level="fair_share")(snap).starts] == ["more"]


def test_among_victims_of_one_level_the_largest_first_so_fewer_restart():
    """A 2-GPU job needs room held by three batch jobs of the same level: one 2-GPU victim pays one restart where
    the two youngest 1-GPU ones would pay two."""
    run = [
        running("pair", {"n0": [0, 1]}, attained_gpu_s=LONG, started_at=NOW - 7200),
        running("one", {"n0": [2]}, attained_gpu_s=LONG, started_at=NOW - 100),
        running("two", {"n0": [3]}, attained_gpu_s=LONG, started_at=NOW - 50),
    ]
    got, _ = preempted(snapshot(nodes(1, 4), [job("new", 2)], run))
    assert got == [("pair", "new", "LeastAttainedService")]


def test_among_equal_victims_the_youngest_first():
    """Two 1-GPU victims of the same level: the one that started last goes, the one that has run longest keeps
    running (so the longest jobs are not all put off to the end); ``las_victims_by="attained"`` takes the one with
    the most attained service (the mirror of the queue's least attained first)."""
    run = [
        running("veteran", {"n0": [0]}, attained_gpu_s=2 * LONG, started_at=NOW - 7200),
        running("fresh", {"n0": [1]}, attained_gpu_s=LONG, started_at=NOW - 60),
    ]
    snap = snapshot(nodes(1, 2), [job("new")], run)
    assert preempted(snap)[0] == [("fresh", "new", "LeastAttainedService")]
    assert preempted(snap, las_victims_by="attained")[0] == [("veteran", "new", "LeastAttainedService")]


H = 3600.0


def test_a_job_that_starved_after_a_preemption_goes_back_to_the_lowest_level():
    # it ran 20 h on one GPU (level 2), was preempted and has waited since; the running job is at level 1
    mid = [running("mid", {"n0": [0]}, attained_gpu_s=2 * H, started_at=NOW - H)]
    for waited, promoted in ((19 * H, False), (21 * H, True)):
        starved = job("starved", attained_gpu_s=LONG, queued_since=NOW - waited)
        snap = snapshot(nodes(1, 1), [starved], mid)
        assert preempted(snap, las_starvation_factor=None)[0] == []
        got, d = preempted(snap, las_starvation_factor=1.0)
        assert got == ([("mid", "starved", "LeastAttainedService")] if promoted else [])
        if not promoted:  # the replay must wake when it starves
            assert d.wake_at is not None and d.wake_at <= NOW - waited + 20 * H


def test_a_job_started_after_starving_is_no_las_victim_for_a_while():
    # queued 30 h ago after 15 h of service; with factor 1 it starved 15 h later. Started 5 h ago (10 h past that),
    # it is protected for those 10 h; started 12 h ago (3 h past), for 3 h, which it has run
    for started_ago, protected in ((5, True), (12, False)):
        resumed = running(
            "resumed", {"n0": [0]}, attained_gpu_s=(15 + started_ago) * H, started_at=NOW - started_ago * H
        )
        resumed.queued_since = NOW - 30 * H
        snap = snapshot(nodes(1, 1), [job("new")], [resumed])
        victim = [("resumed", "new", "LeastAttainedService")]
        assert preempted(snap, las_starvation_factor=None)[0] == victim
        got, d = preempted(snap, las_starvation_factor=1.0)
        assert got == ([] if protected else victim)
        if protected:  # the replay must wake when the protection ends: 10 h after its start
            assert d.wake_at == NOW + 5 * H


def test_the_starvation_factor_must_be_positive():
    for bad in (0, -1.0):
        with pytest.raises(ValueError, match="las_starvation_factor must be above 0"):
            CalderaPolicy(las_starvation_factor=bad)
    assert CalderaPolicy(las_starvation_factor=None).las_starvation_factor is None


def test_a_job_preempted_max_preemptions_per_job_times_is_no_longer_a_victim_of_attained_service():
    at_bound = full()
    at_bound[0].preemptions = 3
    assert preempted(snapshot(nodes(1, 2), [job("new")], at_bound), max_preemptions_per_job=3)[0] == []
    below = full()
    below[0].preemptions = 2
    got = preempted(snapshot(nodes(1, 2), [job("new")], below), max_preemptions_per_job=3)[0]
    assert got == [("long", "new", "LeastAttainedService")]
    assert preempted(snapshot(nodes(1, 2), [job("new")], at_bound), max_preemptions_per_job=None)[0] == got
    with pytest.raises(ValueError):
        CalderaPolicy(max_preemptions_per_job=-1)


def test_the_starvation_wait_cap_promotes_a_long_runner_after_the_cap():
    # it ran 20 h (factor 3: a 60-h patience) and has waited 10 h; a cap of 8 h promotes it now, one of 12 h wakes
    # the replay at 12 h
    mid = [running("mid", {"n0": [0]}, attained_gpu_s=2 * H, started_at=NOW - H)]
    starved = job("starved", attained_gpu_s=LONG, queued_since=NOW - 10 * H)
    snap = snapshot(nodes(1, 1), [starved], mid)
    assert preempted(snap)[0] == []
    assert preempted(snap, las_starvation_max_wait_s=8 * H)[0] == [("mid", "starved", "LeastAttainedService")]
    got, d = preempted(snap, las_starvation_max_wait_s=12 * H)
    assert got == [] and d.wake_at is not None and d.wake_at <= NOW + 2 * H


def test_a_job_started_after_waiting_past_the_cap_stays_protected():
    # queued 30 h ago after 15 h of service, started 5 h ago: factor 3 alone never promoted it (45 h); waited past a
    # 24-h cap, it is no least-attained-service victim however long it runs, and nothing needs waking for it
    for cap, protected in ((24 * H, True), (None, False)):
        resumed = running("resumed", {"n0": [0]}, attained_gpu_s=20 * H, started_at=NOW - 5 * H)
        resumed.queued_since = NOW - 30 * H
        snap = snapshot(nodes(1, 1), [job("new")], [resumed])
        got, d = preempted(snap, las_starvation_max_wait_s=cap)
        assert got == ([] if protected else [("resumed", "new", "LeastAttainedService")])
        if protected:  # no protection ends: no wake-up for it (factor 1 without the cap protects it 5 h more)
            assert d.wake_at == float("inf")
            assert preempted(snap, las_starvation_factor=1.0)[1].wake_at == NOW + 5 * H


def test_the_starvation_wait_cap_must_be_positive():
    with pytest.raises(ValueError, match="las_starvation_max_wait_s must be above 0"):
        CalderaPolicy(las_starvation_max_wait_s=0)
