"""An independent FIFO replay, written from the definition and sharing no code with the simulator or the policy,
agrees job by job with ``caldera sim``'s ``fifo`` policy: same start and finish of every job.

The definition: jobs in submission order (then id); at every instant where jobs arrive or end, the head of the
queue starts while it fits the free GPUs, and everyone behind a head that does not fit waits. On one node, or with
1-GPU jobs, "fits" is just "enough GPUs free", so placement cannot make the two disagree.
"""

from __future__ import annotations

import heapq
import random

import pytest

from caldera.scheduler.fifo import FifoPolicy
from caldera.sim.cluster import ClusterSpec
from caldera.sim.simulator import SimOptions, simulate
from caldera.sim.traces import TraceJob, load_trace


def fifo_by_hand(jobs: list[tuple[str, float, float, int]], total_gpus: int) -> dict[str, tuple[float, float]]:
    """(id, submit, duration, gpus) -> {id: (start, finish)}."""
    arrivals = sorted(jobs, key=lambda j: (j[1], j[0]))
    queue: list[tuple[str, float, float, int]] = []
    ends: list[tuple[float, int]] = []
    free = total_gpus
    out: dict[str, tuple[float, float]] = {}
    i = 0
    while i < len(arrivals) or ends:
        t = min(arrivals[i][1] if i < len(arrivals) else float("inf"), ends[0][0] if ends else float("inf"))
        while ends and ends[0][0] <= t:
            free += heapq.heappop(ends)[1]
        while i < len(arrivals) and arrivals[i][1] <= t:
            queue.append(arrivals[i])
            i += 1
        while queue and queue[0][3] <= free:
            jid, _, dur, g = queue.pop(0)
            free -= g
            out[jid] = (t, t + dur)
            heapq.heappush(ends, (t + dur, g))
    return out


def replayed(jobs: list[TraceJob], cluster: ClusterSpec) -> dict[str, tuple[float, float]]:
    res = simulate(jobs, cluster, FifoPolicy(), SimOptions(strict=True))
    assert not res.dropped
    return {j.sj.id: (j.first_start, j.finish) for j in res.jobs}


def synthetic(n: int, seed: int, max_gpus: int) -> list[TraceJob]:
    rnd = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        t += round(rnd.expovariate(1 / 90))
        out.append(TraceJob(f"j{i}", t, rnd.choice([30, 300, 1200, 3600]), rnd.randint(1, max_gpus), "a", "u"))
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_fifo_agrees_with_a_replay_by_hand_on_one_node(seed) -> None:
    jobs = synthetic(300, seed, 8)
    expected = fifo_by_hand([(j.id, j.submit_time_s, j.duration_s, j.num_gpus) for j in jobs], 8)
    assert replayed(jobs, ClusterSpec.uniform(1, 8, "v100")) == expected


def test_fifo_agrees_with_a_replay_by_hand_on_many_nodes_of_one_gpu_jobs() -> None:
    jobs = synthetic(400, 4, 1)
    expected = fifo_by_hand([(j.id, j.submit_time_s, j.duration_s, 1) for j in jobs], 4 * 4)
    assert replayed(jobs, ClusterSpec.uniform(4, 4, "v100")) == expected


def test_fifo_agrees_with_a_replay_by_hand_on_a_philly_slice(traces_dir) -> None:
    jobs = [j for j in load_trace("philly", traces_dir=traces_dir, limit=600) if j.num_gpus <= 8][:400]
    expected = fifo_by_hand([(j.id, j.submit_time_s, j.duration_s, j.num_gpus) for j in jobs], 8)
    got = replayed(jobs, ClusterSpec.uniform(1, 8, "v100"))
    assert got == expected
    assert len({s for s, _ in got.values()}) > 100  # a real schedule, not everything at once
