"""Where idle GPUs go while jobs wait: one replay, every cycle's idle GPUs put down to why no waiting job took them.

    python benchmarks/idle_capacity.py [--trace alibaba] [--cluster 2x8:v100] [--limit 1500]
                                       [--restart-overhead 300] [--policies tiresias,caldera]
                                       [--options JSON] [--no-classes]

Replays the trace under each policy (the same options as ``sim_quality.py``'s cases; ``--options``: caldera's)
through a wrapper that returns the policy's decisions unchanged and, after each cycle, counts the GPUs its starts
leave idle, up to the next cycle (GPU-seconds), in one of these buckets:

* ``no job waits``: the queue is empty after the cycle;
* ``preemption in flight``: the cycle preempted (the victims' GPUs and the free part of the preemptor's placement
  wait for the victims to stop; with the simulator's zero grace the next cycle comes at the same instant);
* ``reserved``: the free GPUs of nodes a waiting job holds a reservation on (caldera's ``Reserved`` reasons);
* ``fits, not started``: some waiting job would fit GPUs, CPU and memory on a node with idle GPUs (what a policy
  holds back: user caps, capabilities, classes, a reservation's backfill rule);
* ``CPU or memory short``: some waiting job has few enough GPUs per replica for a node's idle GPUs, but not its CPU
  or memory (GPUs stranded behind other jobs' CPU);
* ``too large``: every waiting job asks for more GPUs per replica than any node has idle (or is a gang that does
  not fit).

Prints one table: per policy, the mean GPU allocation, makespan, and each bucket as a share of all GPU-time up to
the makespan. Costs: the wrapper asks for pending reasons (``Snapshot.explain``), a few times slower than a plain
replay.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from caldera.scheduler.registry import get_policy  # noqa: E402
from caldera.scheduler.snapshot import Decisions, SchedJob, Snapshot  # noqa: E402
from caldera.sim.cli import fmt_s  # noqa: E402
from caldera.sim.cluster import ClusterSpec  # noqa: E402
from caldera.sim.metrics import compute_metrics  # noqa: E402
from caldera.sim.simulator import SimOptions, simulate  # noqa: E402
from caldera.sim.traces import TraceJob, load_trace  # noqa: E402

BUCKETS = ("no job waits", "preemption in flight", "reserved", "fits, not started", "CPU or memory short", "too large")


class IdleMeter:
    """Wraps a policy: its decisions unchanged, the idle GPUs after each cycle counted by bucket until the next."""

    def __init__(self, policy) -> None:
        self.policy = policy
        self.name = getattr(policy, "name", "policy")
        self.gpu_s = dict.fromkeys(BUCKETS, 0.0)
        self._last: tuple[float, str, int] | None = None  # (time, bucket, idle GPUs) of the previous cycle

    def __call__(self, snap: Snapshot) -> Decisions:
        d = self.policy(replace(snap, explain=True))
        self._close(snap.now)
        free = _free_after(snap, d)
        idle = sum(g for g, _, _ in free.values())
        self._last = (snap.now, self._bucket(snap, d, free), idle) if idle else None
        return d

    def finish(self, end: float) -> None:
        self._close(end)

    def _close(self, now: float) -> None:
        if self._last is not None:
            t, bucket, idle = self._last
            self.gpu_s[bucket] += idle * max(0.0, now - t)
            self._last = None

    def _bucket(self, snap: Snapshot, d: Decisions, free: dict[str, tuple[int, float, int]]) -> str:
        started = {s.job_id for s in d.starts}
        waiting = [j for j in snap.queued if j.id not in started and j.request.gpu]
        if not waiting:
            return "no job waits"
        if d.preemptions:
            return "preemption in flight"
        reserved: set[str] = set()
        for j in waiting:
            for r in d.pending.get(j.id, ()):
                if r.code == "Reserved":
                    reserved.update(r.details.get("nodes") or ())
        if any(free[n][0] for n in reserved if n in free):
            return "reserved"
        if any(_fits(j, f, cpu_mem=True) for j in waiting for f in free.values()):
            return "fits, not started"
        if any(_fits(j, f, cpu_mem=False) for j in waiting for f in free.values()):
            return "CPU or memory short"
        return "too large"


def _fits(job: SchedJob, free: tuple[int, float, int], cpu_mem: bool) -> bool:
    g, cpu, mem = free
    req = job.request
    if not g or req.gpu > g or (job.replicas > 1 and req.gpu * job.replicas > g):
        return False  # a gang counted on one node only: conservative, it can only say "too large" more often
    return not cpu_mem or (req.cpu <= cpu + 1e-9 and req.memory_mib <= mem)


def _free_after(snap: Snapshot, d: Decisions) -> dict[str, tuple[int, float, int]]:
    """Idle (GPUs, CPU, memory) per schedulable node once the cycle's starts are placed."""
    used: dict[str, list] = {n.name: [0, 0.0, 0] for n in snap.nodes}
    allocs = [a for j in snap.running for a in j.allocations] + [a for s in d.starts for a in s.allocations]
    for a in allocs:
        u = used.get(a.node)
        if u is not None:
            u[0] += len(a.gpus)
            u[1] += a.cpu
            u[2] += a.memory_mib
    return {
        n.name: (len(n.gpus) - used[n.name][0], n.cpu - used[n.name][1], n.memory_mib - used[n.name][2])
        for n in snap.nodes
        if n.schedulable
    }


def measure(jobs: list[TraceJob], spec: ClusterSpec, policy, overhead_s: float) -> tuple[dict, dict[str, float]]:
    """One replay under ``policy``: its metrics, and each bucket's idle GPU-time as a share of all GPU-time up to
    the makespan (with the mean allocation they add up to 1)."""
    meter = IdleMeter(policy)
    metrics = compute_metrics(simulate(jobs, spec, meter, SimOptions(restart_overhead_s=overhead_s)))
    meter.finish(metrics["makespan_s"])
    total = spec.total_gpus * metrics["makespan_s"]
    return metrics, {k: v / total for k, v in meter.gpu_s.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default="alibaba")
    ap.add_argument("--cluster", default="2x8:v100")
    ap.add_argument("--limit", type=int, default=1500)
    ap.add_argument("--restart-overhead", type=float, default=300.0)
    ap.add_argument("--policies", default="tiresias,caldera")
    ap.add_argument("--options", type=json.loads, default={}, help="caldera's options, JSON")
    ap.add_argument("--no-classes", action="store_true", help="every pod normal (sim_quality's alibaba-no-classes)")
    args = ap.parse_args(argv)
    topts = {"qos_priority": False} if args.no_classes else {}
    head = "| policy | GPU alloc | makespan | " + " | ".join(BUCKETS) + " |"
    rows = [head, "|---|" + "---:|" * (len(BUCKETS) + 2)]
    spec = ClusterSpec.parse(args.cluster)
    jobs = load_trace(args.trace, gpus_per_node=spec.max_gpus_per_node, limit=args.limit, **topts)
    for name in [p for p in args.policies.split(",") if p]:
        policy = get_policy(name, **(args.options if name == "caldera" else {}))
        m, share = measure(jobs, spec, policy, args.restart_overhead)
        cells = " | ".join(f"{100 * share[b]:.1f}%" for b in BUCKETS)
        rows.append(f"| {name} | {100 * m['gpu_allocation']['mean']:.1f}% | {fmt_s(m['makespan_s'])} | {cells} |")
    print(f"{args.trace}, first {args.limit:,} jobs, {args.cluster}, {args.restart_overhead:.0f} s per preemption")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
