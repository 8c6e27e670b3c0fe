"""The simulator's shortcuts change how fast a replay runs, never what it decides: skipping the periodic cycles that
``Decisions.wake_at`` says are empty, handing policies an up-to-date capacity index, and not asking for pending
reasons. Each test replays the same jobs with and without a shortcut and compares every job's schedule."""

from __future__ import annotations

import dataclasses
import random

import pytest

from caldera.core.tenancy import PriorityClass, QueueConfig, Quota, UserCaps
from caldera.scheduler.placement import ClusterIndex
from caldera.scheduler.registry import get_policy
from caldera.sim import simulator as simmod
from caldera.sim.cluster import ClusterSpec
from caldera.sim.simulator import SimOptions, SimProgress, Simulator
from caldera.sim.traces import TraceJob, load_trace
from tests.builders import check_decisions, job, nodes, running, snapshot

POLICIES = ("fifo", "tiresias", "caldera")


def schedule(res) -> dict[str, tuple]:
    return {j.sj.id: (j.first_start, j.finish, j.preemptions, j.attempt) for j in res.jobs}


# caldera makes no reservations by default (they cost it on every trace measured); these tests want them too
POLICY_OPTIONS = {"caldera": {"max_reservations": 4}}


def replay(jobs, cluster, policy: str, **opts):
    return Simulator(jobs, cluster, get_policy(policy, **POLICY_OPTIONS.get(policy, {})), SimOptions(**opts)).run()


@pytest.fixture(scope="module")
def philly(traces_dir) -> list[TraceJob]:
    """600 Philly jobs, arriving four times faster and cut to 6 h: the trace's mix of sizes and bursts, but a span
    of days rather than weeks, since the unhinted replay runs every 60-s tick of it."""
    jobs = load_trace("philly", traces_dir=traces_dir, limit=600)
    t0 = jobs[0].submit_time_s
    return [
        dataclasses.replace(j, submit_time_s=t0 + (j.submit_time_s - t0) / 4, duration_s=min(j.duration_s, 6 * 3600.0))
        for j in jobs
    ]


def mixed_jobs(n: int = 400, seed: int = 7) -> list[TraceJob]:
    """Jobs of three accounts in all four priority classes, 1 to 16 GPUs, arriving faster than 24 GPUs serve
    them: reclaim, priority and best-effort preemption, reservations and gangs all happen."""
    rnd = random.Random(seed)
    prios = [
        PriorityClass.HIGH,
        PriorityClass.NORMAL,
        PriorityClass.NORMAL,
        PriorityClass.LOW,
        PriorityClass.BEST_EFFORT,
    ]
    out, t = [], 0.0
    for i in range(n):
        t += rnd.expovariate(1 / 120)
        g = rnd.choice([1, 1, 1, 2, 4, 8, 16])
        acct = rnd.choice(["vision", "nlp", "robotics"])
        out.append(
            TraceJob(
                f"j{i}",
                round(t),
                rnd.choice([60, 600, 1800, 7200, 20000]),
                g,
                acct,
                f"{acct}-u{rnd.randint(0, 2)}",
                rnd.choice(prios),
            )
        )
    return out


def mixed_queues() -> list[QueueConfig]:
    return [
        QueueConfig(name="vision", account="vision", quotas={"gpu": Quota(guarantee=8, deserved=10)}),
        QueueConfig(
            name="nlp",
            account="nlp",
            quotas={"gpu": Quota(guarantee=4, deserved=8, capability=20)},
            user_caps=UserCaps(max_gpus=12),
        ),
        QueueConfig(name="robotics", account="robotics", quotas={"gpu": Quota(deserved=6)}),
    ]


@pytest.mark.parametrize("policy", POLICIES)
def test_wake_hints_skip_only_empty_cycles_on_philly(philly, policy) -> None:
    cluster = ClusterSpec.uniform(12, 8, "v100")  # small enough for queues to build up
    hinted = replay(philly, cluster, policy)
    ticked = replay(philly, cluster, policy, wake_hints=False)
    assert schedule(hinted) == schedule(ticked)
    if policy == "caldera":  # with least-attained-service it asks for every tick while some job could preempt
        assert hinted.tick_cycles <= ticked.tick_cycles
    else:
        assert hinted.tick_cycles < ticked.tick_cycles
    assert hinted.cycles - hinted.tick_cycles == ticked.cycles - ticked.tick_cycles  # every event still has one


@pytest.mark.parametrize("grace", [0.0, 30.0])
@pytest.mark.parametrize("policy", ("tiresias", "caldera"))
@pytest.mark.parametrize("n,seed", [(400, 7), (300, 10)])  # seeds that caught missed time dependencies once
def test_wake_hints_with_preemption_quotas_and_reservations(policy, grace, n, seed) -> None:
    jobs = mixed_jobs(n, seed)
    cluster = ClusterSpec.uniform(3, 8, "a100")
    opts = dict(queues=mixed_queues(), preempt_grace_s=grace, runtime_estimate=1.5, strict=True)
    hinted = replay(jobs, cluster, policy, **opts)
    ticked = replay(jobs, cluster, policy, wake_hints=False, **opts)
    assert schedule(hinted) == schedule(ticked)
    assert sum(hinted.preemptions_by_reason.values()) > 0  # the scenario does exercise preemption
    assert hinted.cycles < ticked.cycles


@pytest.mark.parametrize("policy", POLICIES)
def test_no_shortcut_changes_a_decision_on_mixed_gpu_models(monkeypatch, policy) -> None:
    """The replay hands each cycle a copy of the index it keeps up to date, asks for no reasons and skips empty
    periodic cycles; a replay with none of that (policies rebuild the index from the running jobs and explain every
    waiting job, every tick runs) gives the same schedule, on a cluster of two GPU models."""
    jobs = mixed_jobs(250, seed=3)
    cluster = ClusterSpec.parse("2x8:a100,2x4:v100", 64.0, 512 * 1024)
    opts = dict(queues=mixed_queues(), strict=True)
    fast = replay(jobs, cluster, policy, **opts)

    real = simmod.Snapshot
    seen = []

    def plain_snapshot(**kw):
        kw.pop("capacity")
        kw.pop("explain")
        snap = real(**kw)
        seen.append(snap)
        return snap

    monkeypatch.setattr(simmod, "Snapshot", plain_snapshot)
    plain = replay(jobs, cluster, policy, wake_hints=False, **opts)
    assert seen and seen[0].capacity is None and seen[0].explain
    assert schedule(fast) == schedule(plain)


def test_index_copy_is_the_index_built_from_running_jobs() -> None:
    ns = nodes(3, 8, "a100") + nodes(2, 4, "v100", prefix="v")
    kept = ClusterIndex(ns)
    jobs = [
        running("r0", {"n0": [0, 1, 2]}),
        running("r1", {"n1": range(8)}),
        running("r2", {"v0": [1, 3]}),
        running("r3", [("n2", [4, 5]), ("v1", [0, 1])]),
    ]
    for j in jobs:
        kept.occupy(j.allocations)
    kept.release(jobs[1].allocations)  # r1 ended
    live = [j for j in jobs if j.id != "r1"]

    def state(idx: ClusterIndex):
        return (
            idx.free,
            idx.cpu,
            idx.mem,
            {m: ([list(b) for b in p.buckets], p.maxf, p.total, p.size) for m, p in idx.pools.items()},
        )

    copy, fresh = kept.copy(), ClusterIndex(ns, live)
    assert state(copy) == state(fresh)
    for shape in [(1, None, 1.0, 1024, 1), (4, "a100", 4.0, 4096, 2), (2, "v100", 1.0, 1024, 1), (8, None, 1, 1, 2)]:
        assert copy.place(*shape) == fresh.place(*shape)
    copy.commit(copy.place(8, None, 1.0, 1024, 1), 8, 1.0, 1024)
    assert state(kept.copy()) == state(fresh)  # using a copy leaves the kept index alone


@pytest.mark.parametrize("policy", POLICIES)
def test_no_reasons_same_decisions(policy) -> None:
    queued = [
        job(f"q{i}", g, user=f"u{i % 3}", queued_since=1_000_000.0 - 1000 + i)
        for i, g in enumerate([8, 1, 2, 4, 8, 1, 1, 16, 2])
    ]
    queued[7].replicas, queued[7].request = 2, queued[7].request.model_copy(update={"gpu": 8})
    run = [running("r0", {"n0": range(6)}, started_at=999_000.0), running("r1", {"n1": [0, 1]}, attained_gpu_s=9e4)]
    snap = snapshot(nodes(3), queued, run)
    full = get_policy(policy)(snap)
    check_decisions(snap, full)
    snap.explain = False
    bare = get_policy(policy)(snap)
    assert bare.pending == {}
    assert bare.starts == full.starts and bare.preemptions == full.preemptions and bare.wake_at == full.wake_at


def test_wake_at_per_policy() -> None:
    n = nodes(1, 4)
    # FIFO: the head waits for GPUs only an ending job gives back
    d = get_policy("fifo")(snapshot(n, [job("big", 4)], [running("r", {"n0": [0, 1]})]))
    assert not d.starts and d.wake_at == float("inf")
    # Tiresias: a 2-GPU job at 3,000 GPU-s crosses the first level (3,600 GPU-s) 300 s from now; then the waiting
    # job, still at level 0, may preempt it
    r = running("r", {"n0": [0, 1]}, attained_gpu_s=3000.0)
    d = get_policy("tiresias")(snapshot(n, [job("w", 4)], [r]))
    assert not d.preemptions and d.wake_at == pytest.approx(1_000_000.0 + 300)
    # Caldera: nothing fits and nothing is reserved; the running batch job reaches the first attained-service level
    # (3,600 GPU-s on 2 GPUs) in 1,800 s, when the waiting one may preempt it -> then; an interactive one never does
    d = get_policy("caldera")(snapshot(n, [job("big", 4)], [running("r", {"n0": [0, 1]})]))
    assert not d.starts and d.wake_at == pytest.approx(1_000_000.0 + 1800)
    d = get_policy("caldera")(snapshot(n, [job("big", 4)], [running("r", {"n0": [0, 1]}, interactive=True)]))
    assert not d.starts and d.wake_at == float("inf")
    # Caldera: a starving 4-GPU job reserves the node; a 1-GPU job could use the 2 free GPUs but is kept off them,
    # and the reservation moves as time passes -> ask again
    starving = job("big", 4, queued_since=1_000_000.0 - 3600)
    reserving = get_policy("caldera", max_reservations=4)
    d = reserving(snapshot(n, [starving, job("small", 1)], [running("r", {"n0": [0, 1]})]))
    assert not d.starts and d.wake_at is None
    assert [r.code for r in d.pending["big"]][0] == "Reserved"


def test_progress_reports_and_stuck_detection(traces_dir, monkeypatch) -> None:
    jobs = load_trace("philly", traces_dir=traces_dir, limit=300)
    reports: list[SimProgress] = []
    monkeypatch.setattr(simmod, "PROGRESS_EVERY_S", 0.0)
    res = Simulator(jobs, ClusterSpec.uniform(16, 8), get_policy("fifo"), progress=reports.append).run()
    assert len(reports) >= 2, "reports during the replay and one at the end"
    last = reports[-1]
    assert last.finished == last.total == len(jobs) and last.queued == last.running == 0
    assert last.cycles == res.cycles and last.now_s == res.end_time
    assert all(a.now_s <= b.now_s for a, b in zip(reports, reports[1:]))
    # a queue capped below a job's size: FIFO says nothing but an event could help, and no event is left
    capped = [QueueConfig(name="a", account="a", quotas={"gpu": Quota(capability=1)})]
    res = Simulator(
        [TraceJob("x", 0, 10, 2, "a", "a")], ClusterSpec.uniform(1, 4), get_policy("caldera"), SimOptions(queues=capped)
    ).run()
    assert res.stopped == "stuck" and res.cycles == 1
