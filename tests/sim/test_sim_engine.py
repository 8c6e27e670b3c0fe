"""The simulator on hand-made traces whose metrics are worked out by hand."""

from __future__ import annotations

import math

import pytest

from caldera.core.cluster import Allocation
from caldera.core.tenancy import PriorityClass, QueueConfig, Quota
from caldera.scheduler.fifo import FifoPolicy
from caldera.scheduler.snapshot import Decisions, Preempt, Snapshot, Start
from caldera.sim.cluster import ClusterSpec
from caldera.sim.metrics import compute_metrics, jain_index, resample_steps, time_weighted_mean
from caldera.sim.simulator import (
    SimOptions,
    SimulationError,
    Simulator,
    advance_usage,
    default_queues,
    load_queue_file,
    simulate,
)
from caldera.sim.traces import TraceJob


def tj(id: str, submit: float, dur: float, gpus: int = 1, account: str = "a", prio=PriorityClass.NORMAL) -> TraceJob:
    return TraceJob(id, submit, dur, gpus, account, account, prio)


def one_gpu() -> ClusterSpec:
    return ClusterSpec.uniform(1, 1, "v100", cpu_per_node=8, memory_mib_per_node=65536)


def by_id(res):
    return {j.sj.id: j for j in res.jobs}


# ------------------------------------------------------------------------------------------------ FIFO by hand
def test_fifo_two_jobs_one_gpu_by_hand() -> None:
    # a: 0..100; b arrives at 10, waits for a, runs 100..150; idle 150..300; c runs 300..400
    jobs = [tj("a", 0, 100), tj("b", 10, 50), tj("c", 300, 100)]
    res = simulate(jobs, one_gpu(), FifoPolicy())
    j = by_id(res)
    assert (j["a"].first_start, j["a"].finish) == (0, 100)
    assert (j["b"].first_start, j["b"].finish) == (100, 150)
    assert (j["c"].first_start, j["c"].finish) == (300, 400)
    m = compute_metrics(res)
    assert m["jct_s"]["mean"] == pytest.approx((100 + 140 + 100) / 3)
    assert m["jct_s"]["max"] == 140
    assert m["queueing_delay_s"]["mean"] == pytest.approx(90 / 3)
    assert m["queueing_delay_s"]["max"] == 90
    assert m["makespan_s"] == 400
    assert m["gpu_allocation"]["mean"] == pytest.approx(250 / 400)
    assert m["queue_length"]["mean"] == pytest.approx(90 / 400)  # b waits 10..100
    assert m["jobs"] == {"submitted": 3, "simulated": 3, "completed": 3, "unfinished": 0, "dropped_never_fit": 0}
    assert m["preemptions"]["total"] == 0
    assert m["fairness"]["jain_account_slowdown"] == 1.0  # one account
    # slowdowns: a 1, b 140/50, c 1
    assert m["fairness"]["per_account"]["a"]["mean_slowdown"] == pytest.approx((1 + 2.8 + 1) / 3)
    assert res.stopped == "done"
    # no spinning: a cycle per event batch (arrivals at 0, 10, 300; completions at 100, 150, 400); FIFO's decisions
    # never change with time alone (Decisions.wake_at = inf), so no periodic cycle while b waits
    assert res.cycles == 6 and res.tick_cycles == 0
    # without wake hints, one 60-s tick while b waits (cycle at 10 -> tick at 70), to the same schedule
    ticked = simulate(jobs, one_gpu(), FifoPolicy(), SimOptions(wake_hints=False))
    assert ticked.cycles == 7 and ticked.tick_cycles == 1
    assert [(x.first_start, x.finish) for x in ticked.jobs] == [(x.first_start, x.finish) for x in res.jobs]


def test_simultaneous_events_are_one_cycle() -> None:
    jobs = [tj(f"j{i}", 0, 10) for i in range(4)]
    res = simulate(jobs, ClusterSpec.uniform(1, 4), FifoPolicy(), SimOptions(tick_s=None))
    assert res.cycles == 2  # all four arrive at 0, all four finish at 10
    assert compute_metrics(res)["gpu_allocation"]["mean"] == 1.0


def test_gangs_and_dropped() -> None:
    # 16 GPUs -> 2 x 8 on two 8-GPU nodes; 24 GPUs never fits 16 GPUs and is dropped
    jobs = [tj("big", 0, 100, 16), tj("small", 0, 100, 1), tj("huge", 5, 10, 24)]
    res = simulate(jobs, ClusterSpec.uniform(2, 8), FifoPolicy())
    j = by_id(res)
    assert j["big"].sj.replicas == 2 and j["big"].sj.request.gpu == 8
    assert j["big"].finish == 100 and j["small"].first_start == 100  # FIFO: small waits behind big (same t)
    m = compute_metrics(res)
    assert m["jobs"]["dropped_never_fit"] == 1 and m["jobs"]["submitted"] == 3
    assert [d.id for d in res.dropped] == ["huge"]


def test_time_series_resampling() -> None:
    t, v = resample_steps([0, 10, 20], [1, 0, 2], 0, 40, points=4)
    assert t == [0, 10, 20, 30]
    assert v == [1, 0, 2, 2]
    assert time_weighted_mean([0, 10, 20], [1, 0, 2], 0, 40) == pytest.approx((10 + 0 + 40) / 40)
    _, v = resample_steps([0, 15], [0, 4], 0, 20, points=2)
    assert v == [0, 2]  # [0, 10): 0; [10, 20): half 0, half 4


# ------------------------------------------------------------------------------------------------ Jain
def test_jain_index_known_values() -> None:
    assert jain_index([1, 1, 1, 1]) == 1.0
    assert jain_index([5, 5]) == 1.0
    assert jain_index([1, 0, 0, 0]) == pytest.approx(0.25)
    assert jain_index([1, 2, 3]) == pytest.approx(36 / 42)
    assert jain_index([1, 3]) == pytest.approx(16 / 20)
    assert jain_index([]) == 1.0
    with pytest.raises(ValueError):
        jain_index([-1, 1])


def test_jain_over_accounts() -> None:
    # a and b each have one 100-s job on one GPU at t=0; FIFO by id runs a first: slowdowns 1 (a) and 2 (b)
    res = simulate([tj("a1", 0, 100, account="a"), tj("b1", 0, 100, account="b")], one_gpu(), FifoPolicy())
    m = compute_metrics(res)
    assert m["fairness"]["per_account"]["a"]["mean_slowdown"] == 1
    assert m["fairness"]["per_account"]["b"]["mean_slowdown"] == 2
    assert m["fairness"]["jain_account_slowdown"] == pytest.approx(9 / 10)


# ------------------------------------------------------------------------------------------------ preemption
class HighPreempts:
    """Test policy on a 1-GPU cluster: a high-priority job preempts whatever runs; otherwise FIFO by submission."""

    name = "high-preempts"

    def __call__(self, snap: Snapshot) -> Decisions:
        out = Decisions()
        node = snap.nodes[0].name
        busy = [j for j in snap.running]
        queued = sorted(snap.queued, key=lambda j: (-j.priority.rank, j.submitted_at, j.id))
        if not queued:
            return out
        head = queued[0]
        if not busy:
            out.starts.append(Start(head.id, (Allocation(node, (0,), head.request.cpu, head.request.memory_mib),)))
        elif (
            head.priority is PriorityClass.HIGH
            and all(not j.terminating for j in busy)
            and busy[0].priority is not PriorityClass.HIGH
        ):
            out.preemptions.append(Preempt(busy[0].id, head.id, "Priority", "high job"))
            if self.immediate:
                out.starts.append(Start(head.id, (Allocation(node, (0,), head.request.cpu, head.request.memory_mib),)))
        return out

    def __init__(self, immediate: bool = True) -> None:
        self.immediate = immediate


def test_preemption_requeue_preserves_remaining_work() -> None:
    # a (normal) 0..30 then preempted by b (high, 20 s) at 30; b 30..50; a resumes with 70 s left: 50..120
    jobs = [tj("a", 0, 100), tj("b", 30, 20, prio=PriorityClass.HIGH)]
    res = simulate(jobs, one_gpu(), HighPreempts())
    j = by_id(res)
    assert (j["b"].first_start, j["b"].finish) == (30, 50)
    assert j["a"].first_start == 0 and j["a"].finish == 120
    assert j["a"].preemptions == 1 and j["b"].preemptions == 0
    assert j["a"].sj.attained_gpu_s == pytest.approx(100)  # 30 + 70: nothing lost, nothing counted twice
    assert j["a"].sj.queued_since == 30  # re-queued at the preemption
    m = compute_metrics(res)
    assert m["preemptions"] == {"total": 1, "jobs_preempted": 1, "max_per_job": 1, "by_reason": {"Priority": 1}}
    assert m["jct_s"]["mean"] == pytest.approx((120 + 20) / 2)
    assert m["queueing_delay_s"]["mean"] == 0  # first start - submit, both 0
    assert m["gpu_allocation"]["mean"] == 1.0


def test_preemption_with_restart_overhead_and_grace() -> None:
    jobs = [tj("a", 0, 100), tj("b", 30, 20, prio=PriorityClass.HIGH)]
    res = simulate(jobs, one_gpu(), HighPreempts(), SimOptions(restart_overhead_s=5))
    assert by_id(res)["a"].finish == 125

    # grace 10: a keeps the GPU (terminating) 30..40, work checkpointed at 30; b 40..60; a 60..130
    res = simulate(jobs, one_gpu(), HighPreempts(immediate=False), SimOptions(preempt_grace_s=10))
    j = by_id(res)
    assert (j["b"].first_start, j["b"].finish) == (40, 60)
    assert j["a"].finish == 130
    assert j["a"].sj.attained_gpu_s == pytest.approx(40 + 70)  # it held the GPU during the grace period
    assert not res.invalid_decisions


def test_running_attained_service_is_current_in_snapshots() -> None:
    seen: list[tuple[float, float]] = []

    class Spy(FifoPolicy):
        def __call__(self, snap):
            for j in snap.running:
                seen.append((snap.now, j.attained_gpu_s))
            return super().__call__(snap)

    simulate([tj("a", 0, 100, 2), tj("b", 10, 5, 2)], ClusterSpec.uniform(1, 2), Spy(), SimOptions(wake_hints=False))
    assert (10.0, 20.0) in seen and (70.0, 140.0) in seen  # 2 GPUs x 10 s; the tick at 70: 2 x 70


# ------------------------------------------------------------------------------------------------ bad decisions
class DoubleBooker:
    name = "double"

    def __call__(self, snap: Snapshot) -> Decisions:
        node = snap.nodes[0].name
        return Decisions(starts=[Start(j.id, (Allocation(node, (0,), 1, 1024),)) for j in snap.queued])


def test_invalid_decisions_are_counted_or_raise() -> None:
    jobs = [tj("a", 0, 10), tj("b", 0, 10)]
    res = simulate(jobs, ClusterSpec.uniform(1, 2), DoubleBooker())
    assert res.invalid_decisions.get("start_busy", 0) >= 1
    assert all(j.finish is not None for j in res.jobs)  # b starts once a has gone
    with pytest.raises(SimulationError):
        simulate(jobs, ClusterSpec.uniform(1, 2), DoubleBooker(), SimOptions(strict=True))


class Never:
    name = "never"

    def __call__(self, snap: Snapshot) -> Decisions:
        return Decisions()


def test_stuck_replay_stops() -> None:
    res = simulate([tj("a", 0, 10)], one_gpu(), Never())
    assert res.stopped == "stuck" and res.cycles == 3
    m = compute_metrics(res)
    assert m["jobs"]["unfinished"] == 1 and m["jobs"]["completed"] == 0
    res = simulate([tj("a", 0, 10), tj("b", 1000, 10)], one_gpu(), FifoPolicy(), SimOptions(max_time_s=500))
    assert res.stopped == "max_time" and compute_metrics(res)["jobs"]["unfinished"] == 1


# ------------------------------------------------------------------------------------------------ usage, queues
def test_usage_decay_matches_fairshare() -> None:
    u = advance_usage({}, {"x": 2}, 3600.0, None)
    assert u == {"x": 7200.0}
    h = 3600.0
    u = advance_usage({"x": 100.0}, {"x": 1}, h, h)
    assert u["x"] == pytest.approx(50.0 + h / math.log(2) * 0.5)
    try:
        from caldera.scheduler import fairshare
    except ImportError:
        return
    from caldera.core.resources import Resources
    from caldera.scheduler.snapshot import SchedJob

    run = [SchedJob("j", "u", "a", "q", PriorityClass.NORMAL, Resources(gpu=2))]
    uu, qu = fairshare.advance({"u": 10.0}, {"q": 5.0}, run, 1234.0, 7200.0)
    assert advance_usage({"u": 10.0}, {"u": 2}, 1234.0, 7200.0, fairshare.decay_factor)["u"] == pytest.approx(uu["u"])
    assert advance_usage({"q": 5.0}, {"q": 2}, 1234.0, 7200.0)["q"] == pytest.approx(qu["q"])


def test_usage_reaches_the_policy() -> None:
    seen: list[Snapshot] = []

    class Spy(FifoPolicy):
        def __call__(self, snap):
            seen.append(snap)
            return super().__call__(snap)

    simulate(
        [tj("a", 0, 100, account="p"), tj("b", 50, 10, account="q")],
        one_gpu(),
        Spy(),
        SimOptions(half_life_s=float("inf")),
    )
    at = {round(s.now): s for s in seen}
    assert at[50].user_usage == {"p": 50.0} and at[50].queue_usage == {"p": 50.0}
    assert at[100].queue_usage == {"p": 100.0}
    assert set(at[50].queues) == {"p", "q"}


def test_default_queues_and_queue_file(tmp_path) -> None:
    jobs = [tj("a", 0, 300, 1, "p"), tj("b", 0, 100, 1, "q")]
    qs = default_queues(jobs, 8, "demand")
    assert qs["p"].quotas["gpu"].deserved == pytest.approx(6.0) and qs["q"].quotas["gpu"].deserved == 2.0
    assert qs["p"].quotas["gpu"].capability is None
    qs = default_queues(jobs, 8, "equal")
    assert qs["p"].quotas["gpu"].deserved == 4.0
    assert default_queues(jobs, 8, "none")["p"].quotas == {}

    f = tmp_path / "queues.yaml"
    f.write_text("queues:\n  - name: proj-p\n    account: p\n    weight: 3\n    quotas: {gpu: {guarantee: 1}}\n")
    loaded = load_queue_file(f)
    assert loaded == [QueueConfig(name="proj-p", account="p", weight=3, quotas={"gpu": Quota(guarantee=1)})]
    sim = Simulator(jobs, one_gpu(), FifoPolicy(), SimOptions(queues=loaded))
    assert set(sim.queues) == {"proj-p", "q"}
    res = sim.run()
    assert by_id(res)["a"].sj.queue == "proj-p" and by_id(res)["b"].sj.queue == "q"
    g = tmp_path / "queues.json"
    g.write_text('[{"name": "x", "account": "p"}]')
    assert load_queue_file(g)[0].name == "x"
