"""A replay under least-attained-service with a bound on preemptions per job: the long job that every short
arrival would preempt again is preempted at most that many times, and still finishes."""

from __future__ import annotations

from caldera.scheduler.registry import get_policy
from caldera.sim.cluster import ClusterSpec
from caldera.sim.simulator import SimOptions, Simulator
from caldera.sim.traces import TraceJob


def jobs() -> list[TraceJob]:
    """One 1-GPU job of 40 h, and a 20-minute one every 2 hours: each arrival finds the long job above the first
    attained-service level, on the only GPU."""
    out = [TraceJob("long", 0.0, 40 * 3600.0, 1, "a", "ua")]
    out += [TraceJob(f"s{k}", 2 * 3600.0 * (k + 1), 1200.0, 1, "b", "ub") for k in range(12)]
    return out


def preemptions(bound: int | None) -> dict[str, int]:
    policy = get_policy("caldera", max_preemptions_per_job=bound)
    res = Simulator(jobs(), ClusterSpec.uniform(1, 1), policy, SimOptions(restart_overhead_s=300.0)).run()
    assert all(j.finish is not None for j in res.jobs)
    return {j.sj.id: j.preemptions for j in res.jobs}


def test_the_bound_caps_how_often_one_job_is_preempted():
    unbounded = preemptions(None)
    assert unbounded["long"] > 3  # the scenario preempts it again and again without the bound
    bounded = preemptions(3)
    assert bounded["long"] == 3
    assert max(bounded.values()) <= 3
