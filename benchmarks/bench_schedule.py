"""Per-cycle time of the scheduling policies on a large synthetic cluster.

    python benchmarks/bench_schedule.py [--nodes 1250] [--gpus-per-node 8] [--queued 1000,10000,100000]
                                        [--runs 5] [--policies fifo,tiresias,caldera] [--seed 1]

The cluster: ``nodes`` x ``gpus-per-node`` A100s (96 CPUs, 1 TiB per node), about 80% of the GPUs taken by running
jobs of 1, 2, 4, 8 GPUs and 2 x 8 gangs (3% high, 80% normal, 12% low and 5% best-effort, so preemption has work
to do). 24 queues, with
GPU guarantees adding up to 60% of the cluster, deserved shares, some capabilities and user caps; 300 users with
decayed usage. The queue: 1, 2, 4, 8 GPUs and 2 x 8 / 4 x 8 gangs and 0.2% CPU-only jobs, all four priority classes
(2% high, 73% normal, 15% low, 10% best-effort), 3/4 with a runtime limit, queued over the last two hours (so most
are past the starvation threshold).

Snapshot construction is not timed. Prints the median milliseconds of one ``policy(snapshot)`` call per queue
length and policy, raw and (in brackets) scaled to a 100-ms calibration loop timed just before each call; for
``caldera`` also the next cycle (its decisions applied: started jobs running, victims terminating), read whole and
with the queue's features kept from the first cycle (``Snapshot.queue_memo``, as the simulator passes it), what the
first cycle decided, and how long reading every pending reason's message and details takes afterwards (they are
rendered lazily). A calibration loop tells how fast the (shared) machine was. Exits 0.
"""

from __future__ import annotations

import argparse
import copy
import gc
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from caldera.core.cluster import Allocation, Device, Node  # noqa: E402
from caldera.core.resources import GPU, Resources  # noqa: E402
from caldera.core.tenancy import PriorityClass, QueueConfig, Quota, UserCaps  # noqa: E402
from caldera.scheduler.queue_memo import QueueMemo  # noqa: E402
from caldera.scheduler.registry import get_policy  # noqa: E402
from caldera.scheduler.snapshot import SchedJob, Snapshot  # noqa: E402

NOW = 1_767_000_000.0
CPU_PER_GPU = 8.0
MEM_PER_GPU = 64 * 1024


def make_cluster(n_nodes: int, gpn: int) -> list[Node]:
    return [
        Node(f"n{i:05d}", 96.0, 1024 * 1024, tuple(Device(d, "a100", 81920) for d in range(gpn)))
        for i in range(n_nodes)
    ]


def make_queues(total_gpus: int, n_queues: int = 24) -> dict[str, QueueConfig]:
    out = {}
    g_each = 0.6 * total_gpus / n_queues
    for k in range(n_queues):
        quotas = {
            GPU: Quota(
                guarantee=round(g_each),
                deserved=round(g_each * 1.5),
                capability=round(g_each * 4) if k % 3 == 0 else None,
            )
        }
        caps = UserCaps(max_gpus=64, max_running_jobs=40, max_interactive_jobs=2) if k % 4 == 0 else UserCaps()
        out[f"q{k:02d}"] = QueueConfig(
            name=f"q{k:02d}", account=f"a{k:02d}", weight=1.0 + (k % 3), quotas=quotas, user_caps=caps
        )
    return out


def _res(g: int, cache: dict) -> Resources:
    r = cache.get(g)
    if r is None:
        r = cache[g] = Resources(gpu=g, cpu=CPU_PER_GPU * g if g else 4.0, memory_mib=MEM_PER_GPU * g if g else 16384)
    return r


def make_snapshot(n_queued: int, n_nodes: int = 1250, gpn: int = 8, seed: int = 1, busy: float = 0.8) -> Snapshot:
    rnd = random.Random(seed)
    nodes = make_cluster(n_nodes, gpn)
    queues = make_queues(n_nodes * gpn)
    qnames = list(queues)
    users = [f"u{k:03d}" for k in range(300)]
    user_queue = {u: qnames[k % len(qnames)] for k, u in enumerate(users)}
    cache: dict = {}
    prios = [PriorityClass.HIGH, PriorityClass.NORMAL, PriorityClass.LOW, PriorityClass.BEST_EFFORT]
    # running jobs: fill nodes up to ~busy
    running: list[SchedJob] = []
    target = int(busy * n_nodes * gpn)
    used = 0
    free = {n.name: list(range(gpn)) for n in nodes}
    names = [n.name for n in nodes]
    jid = 0
    while used < target:
        shape = rnd.choices([(1, 1), (2, 1), (4, 1), (8, 1), (8, 2)], [30, 25, 20, 20, 5])[0]
        g, reps = shape
        allocs = []
        for _ in range(reps):
            for _try in range(50):
                name = rnd.choice(names)
                if len(free[name]) >= g:
                    devs = tuple(free[name][:g])
                    del free[name][:g]
                    allocs.append(Allocation(name, devs, CPU_PER_GPU * g, MEM_PER_GPU * g))
                    break
        if len(allocs) != reps:
            continue
        u = rnd.choice(users)
        pr = rnd.choices(prios, [3, 80, 12, 5])[0]
        running.append(
            SchedJob(
                f"r{jid:06d}",
                u,
                "acct",
                user_queue[u],
                pr,
                _res(g, cache),
                replicas=reps,
                submitted_at=NOW - 20000,
                queued_since=NOW - 20000,
                max_runtime_s=rnd.choice([None, 3600.0, 4 * 3600.0, 24 * 3600.0]),
                started_at=NOW - rnd.uniform(0, 8 * 3600),
                allocations=tuple(allocs),
                attained_gpu_s=rnd.uniform(0, 50000),
            )
        )
        jid += 1
        used += g * reps
    queued: list[SchedJob] = []
    shapes = [(1, 1), (2, 1), (4, 1), (8, 1), (8, 2), (8, 4), (0, 1)]
    weights = [50, 20, 14, 10, 4, 1, 0.2]
    t0 = NOW - 7200
    for k in range(n_queued):
        g, reps = rnd.choices(shapes, weights)[0]
        u = rnd.choice(users)
        pr = rnd.choices(prios, [2, 73, 15, 10])[0]
        qsince = t0 + 7200 * k / max(n_queued, 1)
        queued.append(
            SchedJob(
                f"j{k:06d}",
                u,
                "acct",
                user_queue[u],
                pr,
                _res(g, cache),
                replicas=reps,
                submitted_at=qsince,
                queued_since=qsince,
                interactive=(k % 50 == 0),
                max_runtime_s=rnd.choice([None, 1800.0, 3600.0, 4 * 3600.0]),
                attained_gpu_s=rnd.choice([0.0, 0.0, 0.0, rnd.uniform(0, 40000)]),
            )
        )
    user_usage = {u: rnd.uniform(0, 1e6) for u in users}
    queue_usage: dict[str, float] = {}
    for u, v in user_usage.items():
        queue_usage[user_queue[u]] = queue_usage.get(user_queue[u], 0.0) + v
    return Snapshot(
        now=NOW,
        nodes=nodes,
        queued=queued,
        running=running,
        queues=queues,
        user_usage=user_usage,
        queue_usage=queue_usage,
    )


def time_policy(policy, snap: Snapshot, runs: int, memo: QueueMemo | None = None) -> tuple[float, float, object]:
    """Median wall-clock ms of ``policy(snap)``, raw and scaled to a 100-ms calibration loop timed right before each
    call (this VM's speed drifts within seconds). The previous cycle's decisions are dropped (and the garbage
    collector runs) between cycles, outside the timed call. ``memo``: each call gets a copy of it as
    ``Snapshot.queue_memo`` (the state the previous cycle left, the same for every run)."""
    times, scaled = [], []
    d = None
    for _ in range(runs):
        d = None
        if memo is not None:
            snap.queue_memo = copy.copy(memo)
        gc.collect()
        cal = calibrate(2)
        t = time.perf_counter()
        d = policy(snap)
        ms = (time.perf_counter() - t) * 1000
        times.append(ms)
        scaled.append(ms * 100 / cal)
    return statistics.median(times), statistics.median(scaled), d


def apply(snap: Snapshot, d) -> Snapshot:
    """The snapshot one cycle later: started jobs running, preempted ones terminating for their preemptor."""
    queued = {j.id: j for j in snap.queued}
    started = {s.job_id: s for s in d.starts}
    by = {p.job_id: p.by_job_id for p in d.preemptions}
    running = []
    for j in snap.running:
        if j.id in by:
            j = replace(j, terminating=True, preempted_by=by[j.id])
        running.append(j)
    for jid, st in started.items():
        running.append(replace(queued[jid], started_at=snap.now, allocations=st.allocations))
    return Snapshot(
        now=snap.now + 1,
        nodes=snap.nodes,
        queued=[j for j in snap.queued if j.id not in started],
        running=running,
        queues=snap.queues,
        user_usage=snap.user_usage,
        queue_usage=snap.queue_usage,
    )


def calibrate(tries: int = 5) -> float:
    """Milliseconds for a fixed pure-Python loop (best of ``tries``): this VM's speed varies with its neighbours."""
    best = 1e9
    for _ in range(tries):
        t = time.perf_counter()
        s = 0
        for i in range(3_000_000):
            s += i & 7
        best = min(best, time.perf_counter() - t)
    return best * 1000


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1250)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--queued", default="1000,10000,100000")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--policies", default="fifo,tiresias,caldera")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--busy", type=float, default=0.8, help="fraction of GPUs held by running jobs")
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.queued.split(",") if x]
    names = [x for x in args.policies.split(",") if x]
    policies = {name: get_policy(name) for name in names}
    print(
        f"cluster: {args.nodes} nodes x {args.gpus_per_node} GPUs = {args.nodes * args.gpus_per_node} GPUs, "
        f"{args.busy:.0%} busy; median of {args.runs} cycles; python {sys.version.split()[0]}; "
        f"calibration loop {calibrate():.0f} ms (about 100 when the machine is not contended)"
    )
    rows = []
    notes = []
    for n in sizes:
        t = time.perf_counter()
        snap = make_snapshot(n, args.nodes, args.gpus_per_node, args.seed, args.busy)
        build_s = time.perf_counter() - t
        busy = sum(j.gpus for j in snap.running)
        row = [f"{n:,}"]
        for name in names:
            policy = policies[name]
            policy(snap)  # warm up
            ms, norm, d = time_policy(policy, snap, args.runs)
            row.append(f"{ms:.1f} ({norm:.1f})")
            if name == "caldera":
                nxt = apply(snap, d)
                ms2, norm2, d2 = time_policy(policy, nxt, args.runs)
                row.append(f"{ms2:.1f} ({norm2:.1f})")
                # the next cycle as the simulator runs it: the queue's features kept from the first cycle
                memo = QueueMemo()
                snap.queue_memo = memo
                policy(snap)
                snap.queue_memo = None
                ms3, norm3, _ = time_policy(policy, nxt, args.runs, memo)
                nxt.queue_memo = None
                row.append(f"{ms3:.1f} ({norm3:.1f})")
                t = time.perf_counter()
                chars = 0
                for reasons in d.pending.values():
                    for r in reasons:
                        chars += len(r.message) + len(r.details)
                render_ms = (time.perf_counter() - t) * 1000
                codes: dict[str, int] = {}
                for reasons in d.pending.values():
                    codes[reasons[0].code] = codes.get(reasons[0].code, 0) + 1
                notes.append(
                    f"caldera, {n:,} queued: {len(d.starts)} starts, {len(d.preemptions)} preemptions, "
                    f"{len(d.pending):,} pending; first reasons {dict(sorted(codes.items()))}; next cycle: "
                    f"{len(d2.starts)} starts, {len(d2.preemptions)} preemptions; reading every reason's "
                    f"message and details afterwards {render_ms:.0f} ms (snapshot: {len(snap.running)} "
                    f"running jobs on {busy} GPUs, built in {build_s:.1f} s)"
                )
                del d2, nxt
            del d
            gc.collect()
        rows.append(row)
        del snap
        gc.collect()
    header = ["queued"] + [f"{name} ms" for name in names]
    if "caldera" in names:
        at = header.index("caldera ms") + 1
        header[at:at] = ["caldera next cycle ms", "next cycle, queue memo ms"]
    widths = [max(len(h), *(len(r[i]) for r in rows)) + 2 for i, h in enumerate(header)]
    print("".join(h.rjust(w) for h, w in zip(header, widths)))
    for r in rows:
        print("".join(c.rjust(w) for c, w in zip(r, widths)))
    print("(in brackets: each cycle scaled to a 100-ms calibration loop timed just before it)")
    for line in notes:
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
