"""The machinery the preemptive policies share: one cycle's cluster index, soon-free resources, trying preemptions,
the main loop over the ordered queue, and building ``Decisions``.

The main loop is written for very long queues. Each job is summarised by two ints computed in bulk before the
loop: its GPUs per replica and its *group* (the policy decides what a group is, e.g. (priority, queue, user)). A job
is skipped without being looked at when it needs a bigger block than any node has free and its group has no way to
preempt (``pre[group]``), or when its group is blocked as a whole (a user cap or queue capability reached). When no
GPU is free and no group can preempt, the loop jumps to the next CPU-only job or stops: the rest of the queue only
gets its (lazy) ``QueuePosition`` reason.
"""
from __future__ import annotations

from itertools import compress
from operator import attrgetter
from typing import Iterable

import numpy as np

from caldera.scheduler.placement import ClusterIndex, Plan
from caldera.scheduler.quota import never_fits
from caldera.scheduler.reasons import (
    BEST_EFFORT_NO_IDLE, GANG_NO_FIT, NEVER_FITS, PositionContext, build_pending, gpus_phrase, num,
)
from caldera.scheduler.snapshot import Allocation, Decisions, Preempt, Reason, SchedJob, Snapshot, Start

_ID = attrgetter("id")
_RANK_BY_VALUE = {"high": 3, "normal": 2, "low": 1, "best-effort": 0}


def rank_of(priority: object) -> int:
    """PriorityClass.rank, also for a plain string value (PriorityClass members are strings)."""
    return _RANK_BY_VALUE[priority]  # type: ignore[index]


class Victim:
    """A running job as a possible preemption victim (or, when terminating, as soon-free capacity)."""

    __slots__ = ("job", "id", "queue", "rank", "started", "gpus", "model", "allocs", "chosen", "claimed", "level",
                 "attained")

    def __init__(self, job: SchedJob, rank: int, gpus: int, model: str | None) -> None:
        self.job = job
        self.id = job.id
        self.queue = job.queue
        self.rank = rank
        self.started = job.started_at if job.started_at is not None else 0.0
        self.gpus = gpus
        self.model = model
        self.allocs: tuple[Allocation, ...] = job.allocations
        self.chosen = False       # preempted in this cycle
        self.claimed = False      # terminating: its resources are promised to a waiting job in this cycle
        self.level = 0
        self.attained = job.attained_gpu_s


class CycleBase:
    """State of one scheduling cycle. Subclasses set ``order``, ``gl``, ``gil``, ``pre``, ``gblock_all``,
    ``gblock_gpu`` and implement :meth:`consider`."""

    def __init__(self, snap: Snapshot, default_runtime_estimate_s: float) -> None:
        self.snap = snap
        self.now = snap.now
        self.default_rt = default_runtime_estimate_s
        self.idx = ClusterIndex(snap.nodes, snap.running)
        self.nmax = self.idx.largest_node
        self.bfree = self.idx.max_block()   # largest free block usable by any job
        self.bres = 0                       # largest free block counting reserved nodes (0: no reservations)
        self.rtl: list[float] | None = None  # per job in order: max_runtime_s (inf if none), once reservations exist
        self.horizon = 0.0                  # a job with max_runtime_s up to this may backfill some reserved node
        self.starts: list[Start] = []
        self.started_jobs: list[SchedJob] = []
        self.preemptions: list[Preempt] = []
        self.chosen: list[Victim] = []
        self.directed: dict[str, list[Victim]] = {}    # queued job id -> terminating jobs preempted for it
        self.anon: list[Victim] = []                   # terminating jobs preempted for no one known / cancelled
        self.anon_open = 0                             # GPUs of unclaimed anonymous soon-free capacity
        self.held_free_gpus = 0
        self.npre = 0
        self.explicit: list[tuple[int, Reason | list[Reason]]] = []
        self.rcache: dict[tuple, Reason] = {}
        self.started_idx: list[int] = []
        # set by subclasses
        self.queued: list[SchedJob] = snap.queued
        self._ids: list[str] | None = None
        self.oi: list[int] = []                 # scheduling order: indices into ``queued``
        self.oia: np.ndarray = np.zeros(0, dtype=np.intp)
        self.gl: list[int] = []
        self.gil: list[int] = []
        self.pre: list[int] = []
        self.gblock_all: list[Reason | None] = []
        self.gblock_gpu: list[Reason | None] = []

    # ----------------------------------------------------------------------------------------------- helpers
    def ids(self) -> list[str]:
        """Ids of ``queued``, in its order."""
        if self._ids is None:
            self._ids = list(map(_ID, self.queued))
        return self._ids

    def directed_inputs(self) -> list[int]:
        """Indices in ``queued`` of the jobs some terminating job was preempted for."""
        if not self.directed:
            return []
        want = set(self.directed)
        return [k for k, jid in enumerate(self.ids()) if jid in want]

    def runtime_estimate(self, job: SchedJob) -> float:
        return job.max_runtime_s or self.default_rt

    def add_soon_free(self, v: Victim) -> None:
        if v.job.preempted_by:
            self.directed.setdefault(v.job.preempted_by, []).append(v)
        else:
            self.anon.append(v)
            self.anon_open += max(v.gpus, 1)

    def releases(self) -> list[tuple[float, int]]:
        """(time, GPUs) as running and just-started jobs are expected to end, for position estimates."""
        now = self.now
        chosen = {v.id for v in self.chosen}
        out = []
        for job in self.snap.running:
            g = job.request.gpu * job.replicas
            if not g:
                continue
            if job.terminating or job.id in chosen:
                out.append((now, g))
            else:
                st = job.started_at if job.started_at is not None else now
                out.append((st + self.runtime_estimate(job), g))
        for job in self.started_jobs:
            g = job.request.gpu * job.replicas
            if g:
                out.append((now + self.runtime_estimate(job), g))
        return out

    def start(self, job: SchedJob, plan: Plan, g: int, cpu: float, mem: int) -> tuple[Allocation, ...]:
        allocs = self.idx.commit(plan, g, cpu, mem)
        self.starts.append(Start(job.id, allocs))
        self.started_jobs.append(job)
        self.update_bfree()
        return allocs

    def update_bfree(self) -> None:
        self.bfree = self.idx.max_block()

    def try_with(self, g: int, model: str | None, cpu: float, mem: int, n: int,
                 excluded: set[int] | frozenset[int] | None, exclude_models: set[str] | frozenset[str] | None,
                 candidates: Iterable[Victim]) -> tuple[Plan, list[Victim]] | None:
        """Find victims among ``candidates`` (in preference order) whose resources, with the free ones, hold the
        gang. Candidates are taken in order until a node (a set of nodes, for a gang) could hold it; victims that
        turn out not to be needed are then spared, least preferred first. On success the free part of the
        placement is held for the job (so later jobs in this cycle do not take it), the victims are still running in
        the index, and the victims whose resources the placement uses are returned. On failure nothing changes."""
        victims = self._select(g, model, cpu, mem, n, excluded, exclude_models, candidates)
        if not victims:
            return None
        idx = self.idx
        by_name = idx.by_name
        saved: dict[int, tuple[int, int, float, int]] = {}
        for v in victims:
            for a in v.allocs:
                i = by_name.get(a.node)
                if i is not None and i not in saved:
                    saved[i] = (i, idx.free[i], idx.cpu[i], idx.mem[i])
            idx.release(v.allocs, trial=True)
        plan = idx.place(g, model, cpu, mem, n, excluded, exclude_models)
        if plan is None:
            idx.restore(list(saved.values()))
            return None
        parts = plan[1]
        plan_nodes = {i for i, _ in parts}
        needed = [v for v in victims if any(by_name.get(a.node) in plan_nodes for a in v.allocs)]
        rel: dict[int, list[float]] = {}
        for v in needed:
            for a in v.allocs:
                i = by_name.get(a.node)
                if i in plan_nodes:
                    r = rel.setdefault(i, [0.0, 0.0])
                    r[0] += a.cpu
                    r[1] += a.memory_mib
        taken = idx.commit_masks(plan, g, cpu, mem)
        idx.restore(list(saved.values()))
        held = 0
        for i, k in parts:
            s = saved.get(i)
            if s is None:
                held += taken.get(i, 0).bit_count()
                continue
            r = rel.get(i, [0.0, 0.0])
            m = taken.get(i, 0) & s[1]          # devices that were free before any release
            held += m.bit_count()
            idx.hold(i, m, max(0.0, k * cpu - r[0]), int(max(0.0, k * mem - r[1])))
        self.held_free_gpus += held
        self.update_bfree()
        return plan, needed

    def _node_replicas(self, i: int, fr: int, cpu_free: float, mem_free: int, g: int, model: str | None,
                       cpu: float, mem: int, exclude_models: set[str] | frozenset[str] | None) -> int:
        """Replicas of the shape a node holds with free device mask ``fr`` and the given free CPU/memory."""
        best = 0
        for m, mask in self.idx.node_models[i]:
            if (model is not None and m != model) or (exclude_models and m in exclude_models):
                continue
            c = (fr & mask).bit_count() // g
            if c > best:
                best = c
        if cpu > 0:
            best = min(best, int((cpu_free + 1e-9) // cpu))
        if mem > 0:
            best = min(best, mem_free // mem)
        return max(best, 0)

    def _select(self, g: int, model: str | None, cpu: float, mem: int, n: int,
                excluded: set[int] | frozenset[int] | None, exclude_models: set[str] | frozenset[str] | None,
                candidates: Iterable[Victim]) -> list[Victim] | None:
        idx = self.idx
        by_name = idx.by_name
        gain: dict[int, list] = {}      # node -> [device mask, cpu, memory, victims]
        order: list[Victim] = []
        free, cpuf, memf = idx.free, idx.cpu, idx.mem
        total = 0
        base: dict[int, int] = {}
        if n > 1:
            total = idx.fitting_replicas(g, model, cpu, mem, excluded) if g else 0
        found: int | None = None
        for v in candidates:
            order.append(v)
            touched = []
            for a in v.allocs:
                i = by_name.get(a.node)
                if i is None:
                    continue
                st = gain.get(i)
                if st is None:
                    st = gain[i] = [0, 0.0, 0, []]
                st[0] |= idx._mask(i, a.gpus)
                st[1] += a.cpu
                st[2] += a.memory_mib
                if not st[3] or st[3][-1] is not v:
                    st[3].append(v)
                touched.append(i)
            for i in touched:
                if excluded is not None and i in excluded:
                    continue
                st = gain[i]
                c = self._node_replicas(i, free[i] | st[0], cpuf[i] + st[1], memf[i] + st[2], g, model, cpu, mem,
                                        exclude_models)
                if n == 1:
                    if c >= 1:
                        found = i
                        break
                else:
                    if i not in base:
                        base[i] = self._node_replicas(i, free[i], cpuf[i], memf[i], g, model, cpu, mem,
                                                      exclude_models)
                        prev = base[i]
                    else:
                        prev = st[4] if len(st) > 4 else base[i]
                    if len(st) > 4:
                        st[4] = c
                    else:
                        st.append(c)
                    total += c - prev
            if found is not None or (n > 1 and total >= n):
                break
        else:
            return None
        if n > 1:
            return order
        # one node: spare the victims it does not need, least preferred first
        vs = gain[found][3]
        keep = list(vs)
        for v in reversed(vs):
            rest = [w for w in keep if w is not v]
            m, c_, mm = 0, 0.0, 0
            for w in rest:
                for a in w.allocs:
                    if by_name.get(a.node) == found:
                        m |= idx._mask(found, a.gpus)
                        c_ += a.cpu
                        mm += a.memory_mib
            if self._node_replicas(found, free[found] | m, cpuf[found] + c_, memf[found] + mm, g, model, cpu, mem,
                                   exclude_models) >= 1:
                keep = rest
        return keep

    def nofit_reason(self, g: int, model: str | None, cpu: float, mem: int, n: int,
                      excluded: frozenset[int] | None, exclude_models: frozenset[str] | None,
                      best_effort: bool) -> Reason:
        idx = self.idx
        block = idx.max_block(model, exclude_models)
        key = (GANG_NO_FIT, g, model, cpu, mem, n, block, best_effort, exclude_models)
        r = self.rcache.get(key)
        if r is not None:
            return r
        what = f"{model} GPUs" if model else "GPUs"
        if g <= 0:
            msg = (f"needs {n} x {num(cpu)} CPUs and {mem} MiB on one node each and they are not free"
                   if n > 1 else f"needs {num(cpu)} CPUs and {mem} MiB on one node and they are not free")
            d = {"replicas": n, "gpus_per_replica": 0, "cpu_per_replica": num(cpu), "memory_mib_per_replica": mem}
        else:
            head = (f"gang needs {n} x {g} {what} on one node each" if n > 1
                    else f"needs {gpus_phrase(g) if not model else f'{g} {model} GPUs'} on one node")
            fit = -1
            if g > block:
                msg = f"{head} and the largest free block is {block}"
            else:
                fit = idx.fitting_replicas(g, model, cpu, mem, excluded)
                if fit >= n:
                    msg = f"{head}; the free GPUs are in use for jobs waiting for preemptions or reserved"
                elif n > 1:
                    msg = f"{head} and only {fit} blocks of {g} (with the CPU and memory) are free"
                else:
                    msg = f"{head} and no free block of {g} has {num(cpu)} CPUs and {mem} MiB free"
            d = {"replicas": n, "gpus_per_replica": g, "gpu_model": model, "largest_free_block": block,
                 "free_gpus": idx.free_gpus(model)}
            if fit >= 0:
                d["fitting_replicas"] = fit
        if best_effort:
            r = Reason(BEST_EFFORT_NO_IDLE, f"best-effort jobs run only on idle capacity: {msg}", d)
        else:
            r = Reason(GANG_NO_FIT, msg, d)
        self.rcache[key] = r
        return r

    def never(self, job: SchedJob, g: int, model: str | None, n: int) -> Reason:
        key = (NEVER_FITS, g, model, n)
        r = self.rcache.get(key)
        if r is None:
            why = never_fits(job.request, n, self.snap.nodes) or "it is larger than the cluster"
            r = self.rcache[key] = Reason(NEVER_FITS, f"can never be placed: {why}",
                                          {"replicas": n, "gpus_per_replica": g, "gpu_model": model})
        return r

    # ----------------------------------------------------------------------------------------------- the loop
    def consider(self, job: SchedJob, group: int) -> Reason | list[Reason] | None:
        raise NotImplementedError

    def loop(self) -> None:
        queued = self.queued
        oi = self.oi
        gl = self.gl
        gil = self.gil
        pre = self.pre
        gba = self.gblock_all
        gbg = self.gblock_gpu
        consider = self.consider
        explicit = self.explicit
        started = self.started_idx
        n = len(oi)
        i = 0
        bfree = self.bfree
        bres = self.bres
        rtl = self.rtl
        horizon = self.horizon
        while i < n:
            g = gl[i]
            k = gil[i]
            if g > bfree and g > pre[k] and (rtl is None or g > bres or rtl[i] > horizon):
                i += 1
                continue
            r = gba[k]
            if r is None and g:
                r = gbg[k]
            if r is not None:
                explicit.append((i, r))
                i += 1
                continue
            res = consider(queued[oi[i]], k)
            if res is None:
                started.append(i)
            else:
                explicit.append((i, res))
            i += 1
            bfree = self.bfree
            bres = self.bres
            rtl = self.rtl
            horizon = self.horizon
            if bfree == 0 and bres == 0 and self.npre == 0 and i < n:
                try:
                    i = gl.index(0, i)      # only CPU-only jobs can still start
                except ValueError:
                    break

    def decisions(self, extra: dict | None = None, extra_text: str = "", extra_from: int = 1) -> Decisions:
        """Decisions.pending for every queued job that did not start. Built in the snapshot's order of ``queued``
        (sequential passes are several times cheaper than passes in scheduling order on large queues); positions
        follow the scheduling order."""
        queued = self.queued
        n = len(queued)
        oia = self.oia
        ids = self.ids()
        if self.started_idx:
            keep = np.ones(n, dtype=bool)
            keep[oia[np.asarray(self.started_idx, dtype=np.intp)]] = False
            pos_in_order = np.cumsum(keep[oia])
            pos_by_input = np.empty(n, dtype=np.int64)
            pos_by_input[oia] = pos_in_order
            positions: list[int] | range = pos_by_input[keep].tolist()
            ids = list(compress(ids, keep.tolist()))
            rank = np.cumsum(keep) - 1
            oi = self.oi
            explicit = [(int(rank[oi[i]]), r) for i, r in self.explicit]
        else:
            keep = None
            pos_by_input = np.empty(n, dtype=np.int64)
            pos_by_input[oia] = np.arange(1, n + 1)
            positions = pos_by_input.tolist()
            oi = self.oi
            explicit = [(oi[i], r) for i, r in self.explicit]

        def pending_in_order() -> list[SchedJob]:
            if keep is None:
                return list(map(queued.__getitem__, self.oi))
            kl = keep.tolist()
            return [queued[k] for k in self.oi if kl[k]]

        ctx = PositionContext(self.now, pending_in_order, self.idx.total_free_gpus + self.held_free_gpus,
                              self.idx.total_gpus, self.releases, self.runtime_estimate, extra, extra_text, extra_from)
        pending = build_pending(ids, positions, ctx, explicit)
        return Decisions(starts=self.starts, preemptions=self.preemptions, pending=pending)
