"""No starvation of large jobs: reservations, and backfill only with a runtime limit that ends before them."""

from __future__ import annotations

from caldera.scheduler.caldera_policy import CalderaPolicy
from tests.builders import NOW, check_decisions, job, node, nodes, running, snapshot

OLD = NOW - 1000  # past the 300 s starvation threshold


def _cluster():
    # n0: 4 free, the other 4 held until NOW + 1000; n1: full until NOW + 5000
    run = [
        running("r0", {"n0": range(4)}, started_at=NOW - 100, max_runtime_s=1100),
        running("r1", {"n1": range(8)}, started_at=NOW - 100, max_runtime_s=5100),
    ]
    return nodes(2), run


def test_starving_large_job_gets_a_reservation_at_the_earliest_release():
    ns, run = _cluster()
    snap = snapshot(ns, [job("big", 8, queued_since=OLD)], run)
    d = CalderaPolicy(max_reservations=4, priority_preemption=False)(snap)
    r = d.pending["big"][0]
    assert r.code == "Reserved"
    assert r.details["reserved_start"] == NOW + 1000 and r.details["nodes"] == ["n0"]


def test_backfill_only_with_a_runtime_limit_that_ends_before_the_reservation():
    ns, run = _cluster()
    q = [
        job("big", 8, queued_since=OLD),
        job("no-limit", 4, queued_since=NOW - 30),
        job("too-long", 4, queued_since=NOW - 20, max_runtime_s=2000),
        job("short", 4, queued_since=NOW - 10, max_runtime_s=500),
    ]
    snap = snapshot(ns, q, run)
    d = CalderaPolicy(max_reservations=4, priority_preemption=False)(snap)
    check_decisions(snap, d)
    assert [s.job_id for s in d.starts] == ["short"]
    assert d.pending["big"][0].code == "Reserved"
    for jid in ("no-limit", "too-long"):
        r = d.pending[jid][0]
        assert r.code == "BackfillBlocked"
        assert r.details["reserved_for"] == "big" and r.details["reserved_start"] == NOW + 1000
    assert "no runtime limit" in d.pending["no-limit"][0].message


def test_jobs_that_do_not_need_the_reserved_nodes_still_start():
    ns, run = _cluster()
    ns = ns + [node("n2", 4)]
    q = [job("big", 8, queued_since=OLD), job("no-limit", 4, queued_since=NOW - 30)]
    snap = snapshot(ns, q, run)
    d = CalderaPolicy(max_reservations=4, priority_preemption=False)(snap)
    assert [(s.job_id, s.allocations[0].node) for s in d.starts] == [("no-limit", "n2")]


def test_without_starvation_small_jobs_simply_go_ahead():
    ns, run = _cluster()
    q = [job("big", 8, queued_since=NOW - 60), job("no-limit", 4, queued_since=NOW - 30)]
    d = CalderaPolicy(max_reservations=4, priority_preemption=False)(snapshot(ns, q, run))
    assert [s.job_id for s in d.starts] == ["no-limit"]
    assert d.pending["big"][0].code == "GangNoFit"
    d = CalderaPolicy(max_reservations=4, priority_preemption=False, starvation_threshold_s=None)(
        snapshot(ns, [job("big", 8, queued_since=OLD), job("no-limit", 4, queued_since=NOW - 30)], run)
    )
    assert [s.job_id for s in d.starts] == ["no-limit"]


def test_starving_jobs_go_first_within_their_class():
    ns = nodes(1)
    q = [job("young", 8, queued_since=NOW - 10, user="light"), job("old", 8, queued_since=OLD, user="heavy")]
    snap = snapshot(ns, q, user_usage={"heavy": 1e9, "light": 0.0})
    assert [s.job_id for s in CalderaPolicy(max_reservations=4, las_thresholds_gpu_s=None)(snap).starts] == ["old"]
    assert [s.job_id for s in CalderaPolicy(max_reservations=4, starvation_threshold_s=None)(snap).starts] == ["young"]


def test_with_least_attained_service_a_starving_job_is_promoted_but_keeps_its_fair_share_turn():
    """Put first, old jobs with much service would undo what LAS gains; promoted to the lowest level, the starving
    job takes its fair-share turn there, and the reservation keeps it from waiting forever."""
    ns = nodes(1)
    veteran = job("old", 8, queued_since=OLD, user="heavy", attained_gpu_s=1e6)
    climbing = job("young", 8, queued_since=NOW - 10, user="light", attained_gpu_s=4000)  # level 1
    d = CalderaPolicy(max_reservations=4)(snapshot(ns, [climbing, veteran], user_usage={"heavy": 1e9, "light": 0.0}))
    assert [s.job_id for s in d.starts] == ["old"]  # promoted to level 0, despite its service
    fresh = job("young", 8, queued_since=NOW - 10, user="light")  # level 0 too: fair share decides
    d = CalderaPolicy(max_reservations=4)(snapshot(ns, [fresh, veteran], user_usage={"heavy": 1e9, "light": 0.0}))
    assert [s.job_id for s in d.starts] == ["young"] and d.pending["old"][0].code == "Reserved"


def test_default_runtime_estimate_for_jobs_without_a_limit():
    run = [running("r0", {"n0": range(8)}, started_at=NOW - 100)]  # no max_runtime_s
    snap = snapshot(nodes(1), [job("big", 8, queued_since=OLD)], run)
    d = CalderaPolicy(max_reservations=4, priority_preemption=False, default_runtime_estimate_s=600)(snap)
    assert d.pending["big"][0].details["reserved_start"] == NOW + 500


def test_at_most_max_reservations():
    run = [
        running("r0", {"n0": range(8)}, started_at=NOW, max_runtime_s=100),
        running("r1", {"n1": range(8)}, started_at=NOW, max_runtime_s=200),
    ]
    q = [job(f"big{i}", 8, queued_since=OLD + i) for i in range(3)]
    d = CalderaPolicy(priority_preemption=False, max_reservations=1)(snapshot(nodes(2), q, run))
    assert [d.pending[f"big{i}"][0].code for i in range(3)] == ["Reserved", "GangNoFit", "GangNoFit"]
    d = CalderaPolicy(max_reservations=4, priority_preemption=False)(snapshot(nodes(2), q, run))
    assert [d.pending[f"big{i}"][0].code for i in range(3)] == ["Reserved", "Reserved", "GangNoFit"]
    assert d.pending["big1"][0].details["reserved_start"] == NOW + 200
