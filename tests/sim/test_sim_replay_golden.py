"""The replay keeps its schedules: a seeded synthetic trace that makes every kind of event happen (arrivals in
bursts, completions, preemptions with a grace, node failures and repairs, gangs spread over nodes, priority
classes) is replayed under each policy and its per-job CSV compared byte for byte with the one the simulator wrote
before `Simulator._run` became the `Replay` object (tests/sim/data/replay_golden_<policy>.csv, written by the code
of commit 0316375 with `python -m tests.sim.test_sim_replay_golden OUT_DIR`)."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from caldera.core.tenancy import PriorityClass
from caldera.scheduler.registry import get_policy
from caldera.sim.cluster import ClusterSpec
from caldera.sim.metrics import write_job_results
from caldera.sim.simulator import SimOptions, Simulator
from caldera.sim.traces import TraceJob

DATA = Path(__file__).parent / "data"
POLICIES = ("fifo", "tiresias", "caldera")
# the policies' options as commit 0316375 had them by default: the golden files check the refactor, and issue 30's
# later changes of caldera's defaults (the youngest victims first, no least-attained-service among best-effort
# jobs) are changes of policy, not of the replay
OPTIONS = {"caldera": {"las_victims_by": "attained", "las_best_effort": True}}
CLASSES = (PriorityClass.NORMAL, PriorityClass.NORMAL, PriorityClass.HIGH, PriorityClass.LOW, PriorityClass.BEST_EFFORT)


def trace(n: int = 300, seed: int = 7) -> list[TraceJob]:
    rnd = random.Random(seed)
    jobs, t = [], 0.0
    for i in range(n):
        t += rnd.choice((0.0, 0.0, 30.0, rnd.expovariate(1 / 900)))  # bursts: several jobs at one instant
        gpus = rnd.choice((1, 1, 1, 2, 4, 8, 16))
        jobs.append(
            TraceJob(
                f"j{i:04d}", round(t, 3), round(rnd.lognormvariate(7.5, 1.3), 3), gpus,
                f"acct{rnd.randrange(4)}", f"user{rnd.randrange(9)}", priority=rnd.choice(CLASSES),
            )
        )  # fmt: skip
    return jobs


def replay(policy: str, out: Path) -> Path:
    options = SimOptions(
        preempt_grace_s=30.0,
        restart_overhead_s=120.0,
        runtime_estimate=2.0,
        locality_slowdown=0.2,
        node_failures=((20_000.0, "v100-g0-001", 3_000.0), (60_000.0, "v100-g0-003", 600.0)),
        node_mtbf_s=200_000.0,
        node_repair_s=1_800.0,
        strict=True,
    )
    policy_fn = get_policy(policy, **OPTIONS.get(policy, {}))
    res = Simulator(trace(), ClusterSpec.parse("4x8:v100"), policy_fn, options).run()
    assert res.node_failures >= 2 and res.stopped == "done"
    if policy != "fifo":
        assert sum(res.preemptions_by_reason.values()) > 0
    return write_job_results(res, out / f"replay_golden_{policy}.csv")


@pytest.mark.parametrize("policy", POLICIES)
def test_the_replay_writes_the_schedule_it_wrote_before_the_refactor(policy, tmp_path):
    got = replay(policy, tmp_path).read_bytes()
    assert got == (DATA / f"replay_golden_{policy}.csv").read_bytes()


if __name__ == "__main__":
    for name in POLICIES:
        print(replay(name, Path(sys.argv[1])))
