"""The registry, fifo, tiresias, and decisions that stay consistent on random snapshots for all policies."""

from __future__ import annotations

import random

import pytest

from caldera.core.tenancy import PriorityClass, QueueConfig, Quota, UserCaps
from caldera.scheduler.caldera_policy import CalderaPolicy
from caldera.scheduler.registry import POLICIES, get_policy
from caldera.scheduler.tiresias import TiresiasPolicy
from tests.builders import NOW, check_decisions, job, node, nodes, running, snapshot


def test_registry():
    assert set(POLICIES) >= {"fifo", "tiresias", "caldera"}
    for name in POLICIES:
        assert get_policy(name).name == name
    p = get_policy("caldera", starvation_threshold_s=60, default_runtime_estimate_s=120)
    assert p.starvation_threshold_s == 60 and p.default_runtime_estimate_s == 120
    assert get_policy("tiresias", thresholds_gpu_s=[10, 1]).thresholds_gpu_s == (1.0, 10.0)
    with pytest.raises(ValueError, match="unknown policy 'nope'"):
        get_policy("nope")
    with pytest.raises(TypeError):
        get_policy("fifo", no_such_option=1)


def test_fifo_blocks_the_head_of_the_line():
    run = [running("r", {"n0": range(6)})]
    q = [
        job("big", 4, queued_since=NOW - 30),
        job("small", 1, queued_since=NOW - 20),
        job("smaller", 1, queued_since=NOW - 10),
    ]
    d = get_policy("fifo")(snapshot(nodes(1), q, run))
    assert not d.starts
    assert d.pending["big"][0].code == "GangNoFit"
    r = d.pending["small"][0]
    assert r.code == "QueuePosition" and r.details["position"] == 2 and r.details["blocked_by"] == "big"
    assert "behind big" in r.message
    d = get_policy("fifo")(snapshot(nodes(1), q[1:], run))
    assert [s.job_id for s in d.starts] == ["small", "smaller"]


def test_fifo_skips_jobs_that_can_never_fit():
    q = [job("huge", 16, queued_since=NOW - 30), job("ok", 1, queued_since=NOW - 20)]
    d = get_policy("fifo")(snapshot(nodes(1), q))
    assert [s.job_id for s in d.starts] == ["ok"] and d.pending["huge"][0].code == "NeverFits"


def test_tiresias_orders_by_attained_service_then_fifo():
    run = [running("r", {"n0": range(7)})]
    q = [
        job("old-hog", 1, queued_since=NOW - 90, attained_gpu_s=50_000),
        job("mid", 1, queued_since=NOW - 80, attained_gpu_s=5_000),
        job("new-late", 1, queued_since=NOW - 10),
        job("new-early", 1, queued_since=NOW - 20),
    ]
    d = TiresiasPolicy(preemptive=False)(snapshot(nodes(1), q, run))
    assert [s.job_id for s in d.starts] == ["new-early"]
    pos = {k: v[-1].details["position"] for k, v in d.pending.items()}
    assert pos == {"new-late": 1, "mid": 2, "old-hog": 3}
    assert TiresiasPolicy().level(0) == 0 and TiresiasPolicy().level(3600) == 1 and TiresiasPolicy().level(4e4) == 2


def test_tiresias_preempts_jobs_with_more_attained_service_only():
    run = [
        running("hog", {"n0": range(8)}, attained_gpu_s=50_000, started_at=NOW - 10),
        running("young", {"n1": range(8)}, attained_gpu_s=100, started_at=NOW - 5),
    ]
    d = TiresiasPolicy()(snapshot(nodes(2), [job("new", 8)], run))
    assert [(p.job_id, p.by_job_id, p.reason) for p in d.preemptions] == [("hog", "new", "LeastAttainedService")]
    assert d.pending["new"][0].code == "WaitingForPreemption"
    # a job that already has as much service as every running one preempts nobody
    d = TiresiasPolicy()(snapshot(nodes(2), [job("served", 8, attained_gpu_s=60_000)], run))
    assert not d.preemptions and d.pending["served"][0].code == "GangNoFit"
    # next cycle the victim is terminating for it: no new preemption
    run[0].terminating, run[0].preempted_by = True, "new"
    d = TiresiasPolicy()(snapshot(nodes(2), [job("new", 8)], run))
    assert not d.preemptions and d.pending["new"][0].code == "WaitingForPreemption"


def _random_snapshot(rnd: random.Random):
    ns = [
        node(f"n{i}", rnd.choice([4, 8]), rnd.choice(["a100", "a100", "v100"]), cpu=rnd.choice([16, 64]))
        for i in range(rnd.randint(1, 6))
    ]
    free = {n.name: list(range(len(n.gpus))) for n in ns}
    prios = ["high", "normal", "low", "best-effort"]
    qnames = ["qa", "qb", "qc"]
    run = []
    for i in range(rnd.randint(0, 12)):
        n = rnd.choice(ns)
        g = rnd.randint(1, 4)
        if len(free[n.name]) < g:
            continue
        devs = [free[n.name].pop() for _ in range(g)]
        term = rnd.random() < 0.15
        run.append(
            running(
                f"r{i}",
                {n.name: devs},
                queue=rnd.choice(qnames),
                user=rnd.choice("xyz"),
                priority=rnd.choice(prios),
                started_at=NOW - rnd.uniform(0, 5000),
                max_runtime_s=rnd.choice([None, 1000.0]),
                terminating=term,
                preempted_by=(f"j{rnd.randint(0, 20)}" if term and rnd.random() < 0.5 else None),
                attained_gpu_s=rnd.uniform(0, 50_000),
                cpu=rnd.choice([1.0, 4.0]),
            )
        )
    q = [
        job(
            f"j{i}",
            rnd.choice([0, 1, 1, 2, 4, 8]),
            replicas=rnd.choice([1, 1, 1, 2, 3]),
            queue=rnd.choice(qnames + ["unknown"]),
            user=rnd.choice("xyzw"),
            priority=rnd.choice(prios),
            model=rnd.choice([None, None, "a100", "v100"]),
            cpu=rnd.choice([1.0, 4.0, 12.0]),
            queued_since=NOW - rnd.uniform(0, 1000),
            max_runtime_s=rnd.choice([None, 300.0, 5000.0]),
            interactive=rnd.random() < 0.1,
            attained_gpu_s=rnd.choice([0.0, 5000.0, 50_000.0]),
        )
        for i in range(rnd.randint(0, 30))
    ]
    queues = [
        QueueConfig(
            name="qa",
            account="a",
            quotas={"gpu": Quota(guarantee=4, deserved=6, capability=12)},
            user_caps=UserCaps(max_gpus=6, max_running_jobs=3, max_interactive_jobs=1),
        ),
        QueueConfig(name="qb", account="b", weight=2, quotas={"gpu/a100": Quota(guarantee=2, capability=8)}),
        QueueConfig(name="qc", account="c", quotas={"gpu": Quota(deserved=2)}),
    ]
    return snapshot(
        ns,
        q,
        run,
        queues,
        user_usage={u: rnd.uniform(0, 1e5) for u in "xyzw"},
        queue_usage={x: rnd.uniform(0, 1e5) for x in qnames},
    )


@pytest.mark.parametrize("name", ["fifo", "tiresias", "caldera"])
def test_random_snapshots_give_consistent_decisions(name):
    rnd = random.Random(7)
    policy = get_policy(name)
    for _ in range(150):
        snap = _random_snapshot(rnd)
        d = policy(snap)
        check_decisions(snap, d)
        # positions are 1..P over the waiting jobs
        pos = sorted(v[-1].details["position"] for v in d.pending.values())
        assert pos == list(range(1, len(pos) + 1))


def test_random_snapshots_respect_caldera_limits():
    rnd = random.Random(11)
    for _ in range(200):
        snap = _random_snapshot(rnd)
        d = get_policy("caldera")(snap)
        queued = {j.id: j for j in snap.queued}
        run = {j.id: j for j in snap.running}
        qa_gpus = sum(j.gpus for j in snap.running if j.queue == "qa")
        users: dict[str, list[int]] = {}
        for j in snap.running:
            if j.queue == "qa":
                c = users.setdefault(j.user, [0, 0, 0])
                c[0] += j.gpus
                c[1] += 1
                c[2] += j.interactive
        started_users = set()
        for s in d.starts:
            j = queued[s.job_id]
            if j.queue != "qa":
                continue
            qa_gpus += j.gpus
            c = users.setdefault(j.user, [0, 0, 0])
            c[0] += j.gpus
            c[1] += 1
            c[2] += j.interactive
            started_users.add(j.user)
        if any(queued[s.job_id].queue == "qa" and queued[s.job_id].gpus for s in d.starts):
            assert qa_gpus <= 12  # capability
        for u in started_users:
            g, njobs, inter = users[u]
            assert njobs <= 3 and inter <= 1  # max_running_jobs, max_interactive_jobs
            if any(
                queued[s.job_id].queue == "qa" and queued[s.job_id].user == u and queued[s.job_id].gpus
                for s in d.starts
            ):
                assert g <= 6  # max_gpus
        patience = CalderaPolicy().aging_threshold_s
        for p in d.preemptions:
            assert p.by_job_id in queued
            by = queued[p.by_job_id]
            aged = snap.now - by.queued_since >= patience  # a low or best-effort job now treated as normal
            by_rank = max(by.priority.rank, PriorityClass.NORMAL.rank) if aged else by.priority.rank
            if by.priority == "best-effort":  # before aging, only least-attained-service among best-effort jobs
                assert aged or (p.reason == "LeastAttainedService" and run[p.job_id].priority == "best-effort")
            if p.reason == "BestEffort":
                assert run[p.job_id].priority == "best-effort"
            if p.reason == "Priority":
                assert run[p.job_id].queue == queued[p.by_job_id].queue
                assert run[p.job_id].priority.rank < by_rank
            if p.reason == "Reclaim":
                assert run[p.job_id].queue != queued[p.by_job_id].queue
                assert queued[p.by_job_id].queue in ("qa", "qb")  # only they have guarantees


@pytest.mark.parametrize("name", ["fifo", "tiresias", "caldera"])
def test_long_queues_stay_consistent(name):
    rnd = random.Random(3)
    ns = nodes(6, 8, "a100") + nodes(2, 4, "v100", prefix="v")
    run = [
        running("be", {"v0": range(4)}, priority="best-effort"),  # useless to a100 jobs
        running("lo", {"n0": range(8)}, priority="low", queue="qa"),
    ]
    q = [
        job(
            f"j{i:05d}",
            rnd.choice([1, 2, 8]),
            replicas=rnd.choice([1, 1, 2]),
            model=rnd.choice(["a100", None]),
            user=rnd.choice("abcdef"),
            queue=rnd.choice(["qa", "qb"]),
            priority=rnd.choice(["normal", "low"]),
            queued_since=NOW - 3000 + i * 0.5,
            max_runtime_s=rnd.choice([None, 100.0]),
        )
        for i in range(4000)
    ]
    snap = snapshot(ns, q, run)
    d = get_policy(name)(snap)
    check_decisions(snap, d)
    pos = sorted(v[-1].details["position"] for v in d.pending.values())
    assert pos == list(range(1, len(pos) + 1))
    assert len(d.pending) + len(d.starts) == len(q)
