"""benchmarks/idle_capacity.py puts each cycle's idle GPUs down to why no waiting job took them, without changing
what the policy decides; benchmarks/sim_quality.py names the issue-30 criteria a caldera row misses."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from caldera.scheduler.registry import get_policy
from caldera.sim.cluster import ClusterSpec
from caldera.sim.metrics import compute_metrics
from caldera.sim.simulator import SimOptions, simulate
from caldera.sim.traces import TraceJob

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import idle_capacity  # noqa: E402
import sim_quality  # noqa: E402

H = 3600.0
T = 1200.0


def cpu_bound_jobs() -> list[TraceJob]:
    """On one node of 4 GPUs and 64 CPUs: a 2-GPU job takes 60 CPUs for 20 minutes, so a 1-GPU job asking for 10
    CPUs waits that while beside 2 idle GPUs, then runs 20 minutes alone (3 GPUs idle, nothing waiting). Below the
    first attained-service level, so no policy preempts. Ids in
    submission order: with both submitted at 0, the wide one goes first under every policy."""
    return [
        TraceJob("a-wide", 0.0, T, 2, "a", "ua", cpu=60.0, memory_mib=1024),
        TraceJob("b-small", 0.0, T, 1, "b", "ub", cpu=10.0, memory_mib=1024),
    ]


@pytest.mark.parametrize("policy", ["fifo", "tiresias", "caldera"])
def test_idle_gpus_are_put_down_to_cpu_shortage_then_to_an_empty_queue(policy: str) -> None:
    spec = ClusterSpec.uniform(1, 4, "v100", 64.0, 512 * 1024)
    metrics, share = idle_capacity.measure(cpu_bound_jobs(), spec, get_policy(policy), 0.0)
    assert metrics["makespan_s"] == pytest.approx(2 * T)
    assert share["CPU or memory short"] == pytest.approx(2 / 8)  # 2 idle GPUs for T, of 4 GPUs x 2 T
    assert share["no job waits"] == pytest.approx(3 / 8)
    assert sum(share.values()) + metrics["gpu_allocation"]["mean"] == pytest.approx(1.0)


def test_the_meter_leaves_the_schedule_as_it_was() -> None:
    spec = ClusterSpec.uniform(1, 2)
    jobs = [
        TraceJob(f"j{k}", 600.0 * k, 3 * H if k % 3 == 0 else 900.0, 1 + k % 2, "a", f"u{k % 3}") for k in range(12)
    ]
    opts = SimOptions(restart_overhead_s=300.0)
    plain = compute_metrics(simulate(jobs, spec, get_policy("caldera"), opts))
    metered, share = idle_capacity.measure(jobs, spec, get_policy("caldera"), 300.0)
    for key in ("makespan_s", "jct_s", "preemptions"):
        assert metered[key] == plain[key]
    assert sum(share.values()) + metered["gpu_allocation"]["mean"] == pytest.approx(1.0)


def result(alloc: float, makespan: float, preemptions: int, p99: float, mean: float) -> dict:
    return {
        "gpu_allocation": {"mean": alloc},
        "makespan_s": makespan,
        "preemptions": {"total": preemptions},
        "jct_s": {"p99": p99, "mean": mean},
    }


def test_sim_quality_names_each_criterion_a_caldera_row_misses() -> None:
    tiresias = result(0.50, 100.0, 10, 50.0, 20.0)
    assert sim_quality.misses(result(0.495, 102.0, 10, 50.0, 19.0), tiresias) == []
    assert sim_quality.misses(result(0.485, 102.5, 11, 50.1, 20.0), tiresias) == [
        "alloc",
        "makespan",
        "preemptions",
        "p99",
        "avg",
    ]
