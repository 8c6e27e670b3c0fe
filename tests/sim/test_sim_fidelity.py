"""Simulator fidelity: jobs run at their speed on the GPU type they got, slower when a gang is spread over more
nodes than it needs, and node failures kill the jobs on the node (re-queued from their last checkpoint) and hold
the node until its repair."""

from __future__ import annotations

import pytest

from caldera.core.cluster import Allocation
from caldera.scheduler.fifo import FifoPolicy
from caldera.sim.cluster import ClusterSpec
from caldera.sim.simulator import SimOptions, Simulator, simulate
from caldera.sim.traces import TraceJob, load_trace


def finishes(jobs, cluster: str, **opts) -> dict[str, tuple[float, float]]:
    res = simulate(jobs, ClusterSpec.parse(cluster), FifoPolicy(), SimOptions(strict=True, **opts))
    return {j.sj.id: (j.first_start, j.finish) for j in res.jobs}


def test_a_job_runs_at_its_speed_on_the_gpu_type_it_gets():
    job = TraceJob("j", 0.0, 3600.0, 1, "a", "u", speeds={"v100": 1.0, "k80": 0.25})
    assert finishes([job], "1x1:v100")["j"] == (0.0, 3600.0)
    assert finishes([job], "1x1:k80")["j"] == (0.0, 4 * 3600.0)
    assert finishes([job], "1x1:a100")["j"] == (0.0, 3600.0)  # not measured there: runs as given


def test_preempted_work_is_kept_at_the_speed_it_was_done():
    # 1 h on a K80 at a quarter speed is 15 min of work; the rest (45 min) on the V100 after a failure
    job = TraceJob("j", 0.0, 3600.0, 1, "a", "u", gpu_model=None, speeds={"k80": 0.25})
    got = finishes([job], "1x1:k80", node_failures=((3600.0, "k80-g0-000", 60.0),), checkpoint_interval_s=60.0)
    assert got["j"] == (0.0, 3660.0 + 3 * 3600.0)  # back at 3660 s with 45 min of work left at a quarter speed


def test_a_gang_spread_over_more_nodes_than_it_needs_runs_slower():
    spec = ClusterSpec.parse("2x8:v100")
    sim = Simulator([], spec, FifoPolicy(), SimOptions(locality_slowdown=0.2))
    gang = TraceJob("g", 0.0, 100.0, 8, "a", "u", replicas=2, gpus_per_replica=4)
    packed = (Allocation("v100-g0-000", (0, 1, 2, 3), 1, 1), Allocation("v100-g0-000", (4, 5, 6, 7), 1, 1))
    spread = (Allocation("v100-g0-000", (0, 1, 2, 3), 1, 1), Allocation("v100-g0-001", (0, 1, 2, 3), 1, 1))
    assert sim._speed(gang, packed) == 1.0
    assert sim._speed(gang, spread) == pytest.approx(0.8)
    measured = TraceJob(
        "m", 0.0, 100.0, 8, "a", "u", replicas=2, gpus_per_replica=4, speeds={"v100_unconsolidated": 0.6}
    )
    assert sim._speed(measured, spread) == 0.6  # the trace's own measurement wins


def test_gavel_jobs_carry_their_measured_speed_on_every_gpu_type():
    jobs = load_trace("gavel", limit=300)
    resnet = [j for j in jobs if j.speeds and j.speeds.get("k80", 1) < 0.5]
    assert resnet, "Gavel measured K80 far slower than V100 for some job types"
    assert all(j.speeds["v100"] == 1.0 for j in jobs if j.speeds)
    pinned = [j for j in jobs if j.gpu_model == "v100"]  # out of memory on a K80: kept on V100
    assert all("k80" not in (j.speeds or {}) for j in pinned)


def test_a_node_failure_requeues_its_jobs_from_their_last_checkpoint():
    job = TraceJob("j", 0.0, 7200.0, 8, "a", "u")
    other = TraceJob("o", 0.0, 7200.0, 8, "a", "u")
    opts = {"node_failures": ((5400.0, "v100-g0-000", 600.0),), "checkpoint_interval_s": 3600.0}
    res = simulate([job, other], ClusterSpec.parse("2x8:v100"), FifoPolicy(), SimOptions(strict=True, **opts))
    got = {j.sj.id: (j.first_start, j.finish) for j in res.jobs}
    # j ran on the failed node: 1.5 h done, checkpoint at 1 h; back when the node is repaired at 6000 s
    assert got["j"] == (0.0, 6000.0 + 3600.0)
    assert got["o"] == (0.0, 7200.0)  # on the other node: untouched
    assert (res.node_failures, res.failure_kills) == (1, 1)


def test_random_failures_are_the_same_for_every_replay_with_the_same_seed():
    jobs = [TraceJob(f"j{i}", i * 600.0, 4 * 3600.0, 4, "a", "u") for i in range(30)]
    a = finishes(jobs, "4x8:v100", node_mtbf_s=20 * 3600.0, node_repair_s=1800.0, failure_seed=7)
    b = finishes(jobs, "4x8:v100", node_mtbf_s=20 * 3600.0, node_repair_s=1800.0, failure_seed=7)
    none = finishes(jobs, "4x8:v100")
    assert a == b and a != none
    assert max(f for _, f in a.values()) > max(f for _, f in none.values())


def test_failures_of_unknown_nodes_are_refused():
    with pytest.raises(ValueError, match="nodes the cluster does not have"):
        finishes([TraceJob("j", 0.0, 60.0, 1, "a", "u")], "1x1:v100", node_failures=((1.0, "nope", 1.0),))
