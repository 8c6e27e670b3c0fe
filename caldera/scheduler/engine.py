"""The machinery the preemptive policies share: one cycle's cluster index, soon-free capacity, trying preemptions,
the main loop over the ordered queue, and building ``Decisions``.

Designed for very long queues (100,000 jobs in well under 100 ms, pure Python plus numpy for bulk arrays):

* every per-job quantity the loop needs (GPUs per replica, group, order) is computed in a few C-level passes over
  ``Snapshot.queued``; the policy decides what a *group* is (e.g. priority, queue, user);
* the loop skips, vectorised over chunks of the order, every job that needs a bigger block than any usable node
  has free and whose group cannot preempt or use soon-free capacity (``pre[group]``); a job whose group is blocked
  as a whole (user cap, queue capability) gets that reason without being looked at; the skip test is recomputed
  only when something it reads changes (``mver``);
* near the head (``EXPLAIN_HEAD``) skipped jobs still get a specific, memoised reason; deeper ones only their
  ``QueuePosition``, built for the whole queue in one pass (see :mod:`caldera.scheduler.reasons`);
* placement failures are memoised per shape within the cycle, preemption failures per (queue, class, shape);
* after ``GIVE_UP_AFTER`` considered jobs in a row that changed nothing, preemption search stops for the cycle and
  the free-block bound only counts nodes with room for the smallest request in the queue.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from operator import attrgetter
from typing import Any

import numpy as np

from caldera.core.cluster import Allocation
from caldera.scheduler.ordering import gc_paused
from caldera.scheduler.placement import ClusterIndex, Plan
from caldera.scheduler.quota import never_fits
from caldera.scheduler.reasons import (
    BEST_EFFORT_NO_IDLE,
    GANG_NO_FIT,
    NEVER_FITS,
    PendingReasons,
    PositionContext,
    gpus_phrase,
    num,
)
from caldera.scheduler.snapshot import Decisions, Preempt, Reason, SchedJob, Snapshot, Start

_ID = attrgetter("id")
_CPU = attrgetter("request.cpu")
_MEM = attrgetter("request.memory_mib")
GIVE_UP_AFTER = 512
_FRUITFUL = frozenset({"WaitingForPreemption", "Reserved"})  # a considered job that got these changed something
EXPLAIN_HEAD = 256  # jobs this close to the head get a specific reason even when the loop skips them
SMALL_QUEUE = 2048  # shorter queues use a plain loop instead of vectorised chunks
_snew = object.__new__
_set_sid = Start.__dict__["job_id"].__set__
_set_sallocs = Start.__dict__["allocations"].__set__
_set_snote = Start.__dict__["note"].__set__
_RANK_BY_VALUE = {"high": 3, "normal": 2, "low": 1, "best-effort": 0}


def rank_of(priority: object) -> int:
    """PriorityClass.rank, also for a plain string value (PriorityClass members are strings)."""
    return _RANK_BY_VALUE[priority]  # type: ignore[index]


class Victim:
    """A running job as a possible preemption victim (or, when terminating, as soon-free capacity)."""

    __slots__ = (
        "job",
        "id",
        "queue",
        "rank",
        "started",
        "gpus",
        "model",
        "allocs",
        "chosen",
        "claimed",
        "level",
        "parts",
        "soon",
    )

    def __init__(self, job: SchedJob, rank: int, gpus: int, model: str | None) -> None:
        self.job = job
        self.id = job.id
        self.queue = job.queue
        self.rank = rank
        st = job.started_at
        self.started = st if st is not None else 0.0
        self.gpus = gpus
        self.model = model
        self.allocs: tuple[Allocation, ...] = job.allocations
        self.chosen = False  # preempted in this cycle
        self.claimed = False  # terminating: its resources are promised to a waiting job in this cycle
        self.level = 0
        self.parts: list[tuple[int, int, float, int]] | None = None  # (node index, device mask, cpu, memory)
        self.soon = False  # already going (terminating, or the unused rest of one): no new preemption

    @property
    def attained(self) -> float:
        return self.job.attained_gpu_s

    def node_parts(self, idx: ClusterIndex) -> list[tuple[int, int, float, int]]:
        p = self.parts
        if p is None:
            p = []
            for a in self.allocs:
                i = idx.by_name.get(a.node)
                if i is not None:
                    p.append((i, idx._mask(i, a.gpus), a.cpu, a.memory_mib))
            self.parts = p
        return p


class CycleBase:
    """State of one scheduling cycle. Subclasses set ``oia`` (the scheduling order, as indices into ``queued``),
    ``g_sorted`` and ``k_sorted`` (GPUs per replica and group of each job, in that order), call
    :meth:`init_groups` and implement :meth:`consider`."""

    def __init__(self, snap: Snapshot, default_runtime_estimate_s: float) -> None:
        self.snap = snap
        self.now = snap.now
        self.default_rt = default_runtime_estimate_s
        cap = snap.capacity
        self.idx = cap.copy() if cap is not None else ClusterIndex(snap.nodes, snap.running)
        self.explain_head = EXPLAIN_HEAD if snap.explain else 0
        self.nmax = self.idx.largest_node
        self.bfree = self.idx.max_block()  # largest free block usable by any job
        self.bres = 0  # largest free block counting reserved nodes (0: no reservations)
        self._rt: np.ndarray | None = None  # per job in order: runtime_s (inf if none), fetched on demand
        self.horizon = 0.0  # a job with max_runtime_s up to this may backfill some reserved node
        self.mver = 0  # bumped whenever what the loop's skip test reads changes
        self.must_see: np.ndarray | None = None  # per job in order: never skip (e.g. starving, may reserve)
        self.fruitless = 0  # jobs looked at in a row that changed nothing
        self.gave_up = False  # preemption search closed for the rest of the cycle
        self.min_cpu: float | None = None  # smallest CPU / memory request of any queued job, once computed
        self.min_mem: int | None = None
        self.starts: list[Start] = []
        self.started_jobs: list[SchedJob] = []
        self.preemptions: list[Preempt] = []
        self.chosen: list[Victim] = []
        self.directed: dict[str, list[Victim]] = {}  # queued job id -> terminating jobs preempted for it
        self.anon: list[Victim] = []  # terminating jobs preempted for no one known / cancelled
        self.anon_open = 0  # GPUs of unclaimed anonymous soon-free capacity
        self._anon_nodes: dict[int, int] = {}  # node -> GPUs of anonymous soon-free capacity (upper bound)
        self.held_free_gpus = 0
        self.n_holds = 0
        self.explicit: list[tuple[int, Reason | list[Reason]]] = []
        self.rcache: dict[tuple, Reason] = {}
        self._xcache: dict[tuple, Reason] = {}
        self.started_idx: list[int] = []
        # set by subclasses
        self.queued: list[SchedJob] = snap.queued
        # the job the loop considers at an index into ``queued``: a subclass may hand a changed copy (caldera's
        # promotions); the fields the engine reads from ``queued`` itself (id, request, runtime) stay the same
        self.job_at: Callable[[int], SchedJob] = snap.queued.__getitem__
        self.oia: np.ndarray = np.zeros(0, dtype=np.intp)
        self.g_sorted: np.ndarray = np.zeros(0, dtype=np.int64)
        self.k_sorted: np.ndarray = np.zeros(0, dtype=np.intp)
        self.init_groups(0)

    @classmethod
    def decide(cls, *args) -> Decisions:
        """A whole cycle: build it (``args`` as the subclass's constructor takes them), run the loop and return its
        decisions, with the garbage collector paused."""
        with gc_paused():
            cycle = cls(*args)
            cycle.loop()
            return cycle.decisions()

    def init_groups(self, G: int) -> None:
        """Per group: ``pre`` (largest node size when the group could preempt or use soon-free capacity, else 0)
        and whole-group blocks (a reason for all its jobs, or for its GPU jobs). Kept as lists; the loop takes
        numpy copies when they changed."""
        self.pre: list[int] = [0] * G
        self.gblock_all: list[Reason | None] = [None] * G
        self.gblock_gpu: list[Reason | None] = [None] * G
        self._gver = -1
        self._gchg = 0
        self._pre_np = self._gba_np = self._gbg_np = np.zeros(0)

    def set_pre(self, k: int, v: int) -> None:
        if self.pre[k] != v:
            self.pre[k] = v
            self.mver += 1
            self._gchg += 1

    def block(self, k: int, reason: Reason, gpu_only: bool) -> None:
        """Give every (GPU, when ``gpu_only``) job of group ``k`` that comes later ``reason``, without looking."""
        if gpu_only:
            if self.gblock_gpu[k] is not reason:
                self.gblock_gpu[k] = reason
                self.mver += 1
                self._gchg += 1
        elif self.gblock_all[k] is not reason:
            self.gblock_all[k] = reason
            self.mver += 1
            self._gchg += 1

    def _group_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._gver != self._gchg:
            self._gver = self._gchg
            self._pre_np = np.array(self.pre, dtype=np.int64)
            self._gba_np = np.array([r is not None for r in self.gblock_all], dtype=bool)
            self._gbg_np = np.array([r is not None for r in self.gblock_gpu], dtype=bool)
        return self._pre_np, self._gba_np, self._gbg_np

    # ----------------------------------------------------------------------------------------------- helpers
    def runtime_estimate(self, job: SchedJob) -> float:
        return job.runtime_s or self.default_rt

    def add_soon_free(self, v: Victim) -> None:
        v.soon = True
        if v.job.preempted_by:
            self.directed.setdefault(v.job.preempted_by, []).append(v)
        elif v.gpus:
            self._add_anon(v)

    def _add_anon(self, v: Victim) -> None:
        self.anon.append(v)
        self.anon_open += v.gpus
        an = self._anon_nodes
        for i, m, _, _ in v.node_parts(self.idx):
            an[i] = an.get(i, 0) + m.bit_count()

    def resolve_directed(self) -> list[int]:
        """Indices in ``queued`` of the jobs terminating jobs were preempted for; soon-free capacity promised to a
        job that is no longer queued becomes anyone's."""
        if not self.directed:
            return []
        queued = self.queued
        memo = self.snap.queue_memo
        found = None if memo is None else memo.find(queued, self.directed)
        if found is None:
            wanted = set(self.directed).__contains__
            found = np.flatnonzero(np.fromiter(map(wanted, map(_ID, queued)), dtype=bool, count=len(queued))).tolist()
            if memo is not None:
                memo.note({queued[k].id: k for k in found})
        present = {queued[k].id for k in found}
        for jid in [j for j in self.directed if j not in present]:
            for v in self.directed.pop(jid):
                if v.gpus:
                    self._add_anon(v)
        return found

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
        st = _snew(Start)
        _set_sid(st, job.id)
        _set_sallocs(st, allocs)
        _set_snote(st, "")
        self.starts.append(st)
        self.started_jobs.append(job)
        self.update_bfree()
        return allocs

    def update_bfree(self) -> None:
        if self.min_cpu is not None:
            b = self.idx.max_block_where(self.min_cpu, self.min_mem or 0, None)
        else:
            b = self.idx.max_block()
        if b != self.bfree:
            self.bfree = b
            self.mver += 1

    def try_with(
        self,
        g: int,
        model: str | None,
        cpu: float,
        mem: int,
        n: int,
        excluded: set[int] | frozenset[int] | None,
        exclude_models: set[str] | frozenset[str] | None,
        candidates: Iterable[Victim],
        potential: Callable[[int], int] | None = None,
    ) -> tuple[Plan, list[Victim]] | None:
        """Find victims among ``candidates`` (in preference order) whose resources, with the free ones, hold the
        gang. ``potential(node)``, when given, bounds the GPUs the candidates could ever free there (plus free
        ones): nodes below the per-replica need are not worth accumulating. Candidates are taken in order until a node
        (a set of nodes, for a gang) could hold it; victims that
        turn out not to be needed are then spared, least preferred first. On success the free part of the
        placement is held for the job (so later jobs in this cycle do not take it), the victims are still running in
        the index, and the victims whose resources the placement uses are returned. On failure nothing changes."""
        victims = self._select(g, model, cpu, mem, n, excluded, exclude_models, candidates, potential)
        if not victims:
            return None
        idx = self.idx
        saved: dict[int, tuple[int, int, float, int]] = {}
        for v in victims:
            for i, m, c_, mm in v.node_parts(idx):
                if i not in saved:
                    saved[i] = (i, idx.free[i], idx.cpu[i], idx.mem[i])
                idx.give(i, m, c_, mm)
        plan = idx.place(g, model, cpu, mem, n, excluded, exclude_models)
        if plan is None:
            idx.restore(list(saved.values()))
            return None
        parts = plan[1]
        plan_nodes = {i for i, _ in parts}
        needed = [v for v in victims if any(p[0] in plan_nodes for p in v.node_parts(idx))]
        rel: dict[int, list[float]] = {}
        for v in needed:
            for i, _, c_, mm in v.node_parts(idx):
                if i in plan_nodes:
                    r = rel.setdefault(i, [0.0, 0.0])
                    r[0] += c_
                    r[1] += mm
        taken = idx.commit_masks(plan, g, cpu, mem)
        idx.restore(list(saved.values()))
        self._leftovers(needed, taken, plan_nodes)
        held = 0
        for i, k in parts:
            s = saved.get(i)
            if s is None:
                held += taken.get(i, 0).bit_count()
                continue
            r = rel.get(i, [0.0, 0.0])
            m = taken.get(i, 0) & s[1]  # devices that were free before any release
            held += m.bit_count()
            idx.hold(i, m, max(0.0, k * cpu - r[0]), int(max(0.0, k * mem - r[1])))
        self.held_free_gpus += held
        self.n_holds += 1
        self.update_bfree()
        return plan, needed

    def _leftovers(self, needed: list[Victim], taken: dict[int, int], plan_nodes: set[int]) -> None:
        """The parts of the victims the placement does not use will be free soon too: offer them to anyone."""
        idx = self.idx
        for v in needed:
            parts = []
            for i, m, c_, mm in v.node_parts(idx):
                lm = m & ~taken.get(i, 0) if i in plan_nodes else m
                if lm:
                    f = lm.bit_count() / max(m.bit_count(), 1)
                    parts.append((i, lm, c_ * f, int(mm * f)))
            if not parts:
                continue
            lv = Victim(v.job, v.rank, sum(p[1].bit_count() for p in parts), v.model)
            lv.parts = parts
            lv.allocs = ()
            lv.soon = True
            self._add_anon(lv)

    def _node_replicas(
        self,
        i: int,
        fr: int,
        cpu_free: float,
        mem_free: int,
        g: int,
        model: str | None,
        cpu: float,
        mem: int,
        exclude_models: set[str] | frozenset[str] | None,
    ) -> int:
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

    def all_victims(self) -> Iterable[Victim]:
        """Every running job that could ever be preempted or is terminating (subclasses)."""
        return ()

    def _select(
        self,
        g: int,
        model: str | None,
        cpu: float,
        mem: int,
        n: int,
        excluded: set[int] | frozenset[int] | None,
        exclude_models: set[str] | frozenset[str] | None,
        candidates: Iterable[Victim],
        potential: Callable[[int], int] | None = None,
    ) -> list[Victim] | None:
        idx = self.idx
        hopeless: set[int] = set()
        hopeful: set[int] = set()
        gain: dict[int, list] = {}  # node -> [device mask, cpu, memory, victims, replicas]
        order: list[Victim] = []
        free, cpuf, memf, nmodels = idx.free, idx.cpu, idx.mem, idx.node_models
        total = idx.fitting_replicas(g, model, cpu, mem, excluded) if n > 1 else 0
        found = -1
        replicas = self._node_replicas
        eps = 1e-9
        for v in candidates:
            order.append(v)
            parts = v.parts if v.parts is not None else v.node_parts(idx)
            for i, m, c_, mm in parts:
                if potential is not None and i not in hopeful:
                    if i in hopeless:
                        continue
                    if potential(i) < g:
                        hopeless.add(i)
                        continue
                    hopeful.add(i)
                st = gain.get(i)
                if st is None:
                    st = gain[i] = [m, c_, mm, [v], -1]
                else:
                    st[0] |= m
                    st[1] += c_
                    st[2] += mm
                    if st[3][-1] is not v:
                        st[3].append(v)
                if excluded is not None and i in excluded:
                    continue
                fr = free[i] | st[0]
                models = nmodels[i]
                if len(models) == 1 and exclude_models is None and (model is None or models[0][0] == model):
                    c = (fr & models[0][1]).bit_count() // g
                    if cpu > 0 and c and cpuf[i] + st[1] + eps < cpu * c:
                        c = min(c, int((cpuf[i] + st[1] + eps) // cpu))
                    if mem > 0 and c and memf[i] + st[2] < mem * c:
                        c = min(c, (memf[i] + st[2]) // mem)
                else:
                    c = replicas(i, fr, cpuf[i] + st[1], memf[i] + st[2], g, model, cpu, mem, exclude_models)
                if n == 1:
                    if c >= 1:
                        found = i
                        break
                else:
                    prev = st[4]
                    if prev < 0:
                        prev = replicas(i, free[i], cpuf[i], memf[i], g, model, cpu, mem, exclude_models)
                    st[4] = c
                    total += c - prev
            if found >= 0 or (n > 1 and total >= n):
                break
        else:
            return None
        if n > 1:
            # only victims on nodes that gained room for a replica can matter
            useful = {
                i
                for i, st in gain.items()
                if st[4] >= 0 and st[4] > replicas(i, free[i], cpuf[i], memf[i], g, model, cpu, mem, exclude_models)
            }
            return [v for v in order if any(p[0] in useful for p in v.node_parts(idx))] or None
        # one node: spare the victims it does not need, least preferred first
        vs = gain[found][3]
        if len(vs) == 1:
            return vs
        keep = list(vs)
        for v in reversed(vs):
            rest = [w for w in keep if w is not v]
            m, c_, mm = 0, 0.0, 0
            for w in rest:
                for i, wm, wc, wmm in w.node_parts(idx):
                    if i == found:
                        m |= wm
                        c_ += wc
                        mm += wmm
            if (
                replicas(found, free[found] | m, cpuf[found] + c_, memf[found] + mm, g, model, cpu, mem, exclude_models)
                >= 1
            ):
                keep = rest
        return keep

    def never_quick(self, g: int, model: str | None, n: int) -> bool:
        """True when ``n`` x ``g`` GPUs can never fit: more per replica than any node has, or more than the
        cluster (or the model's pool) has in all."""
        if not g:
            return False
        idx = self.idx
        if model is not None:
            pool = idx.pools.get(model)
            return pool is None or g > pool.largest_node or g * n > pool.size
        if g > idx.largest_node:
            return True
        return g * n > max((p.size for p in idx.pools.values()), default=0)

    def nofit_reason(
        self,
        g: int,
        model: str | None,
        cpu: float,
        mem: int,
        n: int,
        excluded: frozenset[int] | None,
        exclude_models: frozenset[str] | None,
        best_effort: bool,
    ) -> Reason:
        idx = self.idx
        block = idx.max_block(model, exclude_models)
        key = (GANG_NO_FIT, g, model, cpu, mem, n, block, best_effort, exclude_models)
        r = self.rcache.get(key)
        if r is not None:
            return r
        what = f"{model} GPUs" if model else "GPUs"
        if g <= 0:
            msg = (
                f"needs {n} x {num(cpu)} CPUs and {mem} MiB on one node each and they are not free"
                if n > 1
                else f"needs {num(cpu)} CPUs and {mem} MiB on one node and they are not free"
            )
            d: dict[str, Any] = {
                "replicas": n,
                "gpus_per_replica": 0,
                "cpu_per_replica": num(cpu),
                "memory_mib_per_replica": mem,
            }
        else:
            head = (
                f"gang needs {n} x {g} {what} on one node each"
                if n > 1
                else f"needs {gpus_phrase(g) if not model else f'{g} {model} GPUs'} on one node"
            )
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
            d = {
                "replicas": n,
                "gpus_per_replica": g,
                "gpu_model": model,
                "largest_free_block": block,
                "free_gpus": idx.free_gpus(model),
            }
            if fit >= 0:
                d["fitting_replicas"] = fit
        out = self.unschedulable()
        if out:  # a cordoned or drained node's room does not count; the user should know it may come back
            msg += f"; {out}"
            d["unschedulable_nodes"] = [node.name for node in self.snap.nodes if not node.schedulable][:5]
        if best_effort:
            r = Reason(BEST_EFFORT_NO_IDLE, f"best-effort jobs run only on idle capacity: {msg}", d)
        else:
            r = Reason(GANG_NO_FIT, msg, d)
        self.rcache[key] = r
        return r

    def unschedulable(self) -> str:
        """The nodes placement may not use now (cordoned or drained by an admin), as the "why" names them."""
        out = [node.name for node in self.snap.nodes if not node.schedulable]
        if not out:
            return ""
        more = f" and {len(out) - 5} more" if len(out) > 5 else ""
        return f"not schedulable (cordoned): {', '.join(out[:5])}{more}"

    def never(self, job: SchedJob, g: int, model: str | None, n: int) -> Reason:
        key = (NEVER_FITS, g, model, n)
        r = self.rcache.get(key)
        if r is None:
            why = never_fits(job.request, n, self.snap.nodes)
            if why is None:  # it fits the cluster's nodes, but not the schedulable ones
                why = self.unschedulable() or "it is larger than the cluster"
            r = self.rcache[key] = Reason(
                NEVER_FITS, f"can never be placed: {why}", {"replicas": n, "gpus_per_replica": g, "gpu_model": model}
            )
        return r

    # ----------------------------------------------------------------------------------------------- the loop
    def consider(self, job: SchedJob, group: int) -> Reason | list[Reason] | None:
        raise NotImplementedError

    def explain(self, job: SchedJob, group: int) -> Reason:
        """Why a job the loop skipped (it needs a bigger block than any node has free) does not start. Memoised
        on what the answer depends on."""
        req = job.request
        key = (
            req.gpu,
            req.gpu_model,
            req.cpu,
            req.memory_mib,
            job.replicas,
            self.best_effort_group(group),
            job.runtime_s,
            self.mver,
        )  # mver moves with free blocks and reservations
        r = self._xcache.get(key)
        if r is None:
            r = self._xcache[key] = self._explain(job, group)
        return r

    def _explain(self, job: SchedJob, group: int) -> Reason:
        req = job.request
        g, model, n = req.gpu, req.gpu_model, job.replicas
        if g and self.never_quick(g, model, n):
            return self.never(job, g, model, n)
        return self.nofit_reason(g, model, req.cpu, req.memory_mib, n, None, None, self.best_effort_group(group))

    def best_effort_group(self, group: int) -> bool:
        return False

    def give_up(self) -> None:
        """Called after GIVE_UP_AFTER jobs in a row achieved nothing: stop looking for preemptions for the rest of
        the cycle (jobs deeper in the order are less deserving; they are considered again next cycle), and bound the
        free blocks by the smallest CPU and memory request of any queued job, so nodes with free GPUs but no room
        for even the smallest replica stop attracting every small job."""
        self.gave_up = True
        if self.min_cpu is None:
            queued = self.queued
            self.min_cpu = min(map(_CPU, queued), default=0.0)
            self.min_mem = min(map(_MEM, queued), default=0)
        self.close_avenues()
        self.update_bfree()
        self.mver += 1

    def close_avenues(self) -> None:
        """Subclasses: set ``pre`` to 0 wherever only preemption could help."""

    def _runtimes(self, i: int, mask: np.ndarray) -> np.ndarray:
        """runtime_s (inf when unknown) of the jobs at order positions ``i + flatnonzero(mask)``; the others are
        left as they are (NaN when never fetched)."""
        rt = self._rt
        if rt is None:
            rt = self._rt = np.full(len(self.oia), np.nan)
        seg = rt[i : i + len(mask)]
        todo = np.flatnonzero(mask & np.isnan(seg))
        if len(todo):
            queued = self.queued
            ks = self.oia[todo + i].tolist()
            vals = [queued[k].runtime_s for k in ks]
            seg[todo] = [v if v else np.inf for v in vals]
        return seg

    def loop(self) -> None:
        """Consider the jobs in order. The skip test runs vectorised over chunks of the order and is recomputed
        only when something it reads changes (``mver``): a job is skipped when it needs a bigger block than any
        usable node has free, its group cannot preempt, and it cannot backfill a reserved node; a job whose group is
        blocked gets that group's reason without being looked at."""
        if len(self.oia) <= SMALL_QUEUE:
            return self._loop_small()
        job_at = self.job_at
        oia = self.oia
        item = oia.item
        gs = self.g_sorted
        ks = self.k_sorted
        consider = self.consider
        explicit = self.explicit
        gba_l = self.gblock_all
        gbg_l = self.gblock_gpu
        n = len(oia)
        i = 0
        chunk = 256
        while i < n:
            j = min(n, i + chunk)
            ver = self.mver
            pre_np, gba_np, gbg_np = self._group_arrays()
            g = gs[i:j]
            k = ks[i:j]
            skip = (g > self.bfree) & (g > pre_np[k])
            if self.bres > self.bfree:
                # fits only a reserved node: skip unless its runtime limit ends before a reservation
                could = skip & (g <= self.bres)
                if could.any():
                    skip &= ~(could & (self._runtimes(i, could) <= self.horizon))
            if self.must_see is not None:
                skip &= ~self.must_see[i:j]
            blk = gba_np[k] | (gbg_np[k] & (g > 0))
            if i < self.explain_head:  # near the head, skipped jobs still get a specific reason
                sel = np.arange(j - i)
            else:
                sel = np.flatnonzero(~skip | blk)
            restart = -1
            if len(sel):
                sk = skip[sel].tolist()
                for p, b, kk, s_ in zip((sel + i).tolist(), blk[sel].tolist(), k[sel].tolist(), sk):
                    if self.mver != ver:
                        restart = p
                        break
                    if b:
                        r = gba_l[kk]
                        explicit.append((p, r if r is not None else gbg_l[kk]))
                        continue
                    if s_:
                        explicit.append((p, self.explain(job_at(item(p)), kk)))
                        continue
                    self._tried(p, consider(job_at(item(p)), kk))
            if restart >= 0:
                i = restart
                chunk = 256
            else:
                i = j
                if self.mver == ver:
                    chunk = min(chunk * 2, 16384)

    def _tried(self, p: int, res) -> None:
        """Record what trying the job at position ``p`` gave; a long run of tries that neither start a job nor
        make room ends the preemption search for this cycle."""
        if res is None:
            self.started_idx.append(p)
            self.fruitless = 0
            return
        self.explicit.append((p, res))
        if getattr(res, "code", None) in _FRUITFUL:
            self.fruitless = 0
        else:
            self.fruitless += 1
            if self.fruitless == GIVE_UP_AFTER:
                self.give_up()

    def _loop_small(self) -> None:
        """The same loop without numpy, cheaper for short queues."""
        queued = self.queued
        job_at = self.job_at
        order = self.oia.tolist()
        gl = self.g_sorted.tolist()
        kl = self.k_sorted.tolist()
        must = self.must_see.tolist() if self.must_see is not None else None
        pre = self.pre
        gba = self.gblock_all
        gbg = self.gblock_gpu
        explicit = self.explicit
        consider = self.consider
        explain = self.explain
        bfree = self.bfree
        head = self.explain_head
        for p in range(len(order)):
            g = gl[p]
            k = kl[p]
            r = gba[k]
            if r is None and g:
                r = gbg[k]
            if r is not None:
                explicit.append((p, r))
                continue
            if (
                g > bfree
                and g > pre[k]
                and not (must is not None and self.must_see is not None and must[p])
                and not (
                    self.bres > bfree and g <= self.bres and (queued[order[p]].runtime_s or np.inf) <= self.horizon
                )
            ):
                if p < head:
                    explicit.append((p, explain(job_at(order[p]), k)))
                continue
            self._tried(p, consider(job_at(order[p]), k))
            bfree = self.bfree

    def decisions(self, extra: dict | None = None, extra_text: str = "", extra_from: int = 1) -> Decisions:
        """Decisions.pending for every queued job that did not start, keyed in the snapshot's order of ``queued``
        (sequential passes are several times cheaper than passes in scheduling order on large queues); positions
        follow the scheduling order."""
        if not self.snap.explain:
            return Decisions(starts=self.starts, preemptions=self.preemptions, wake_at=self.wake_at())
        queued = self.queued
        n = len(queued)
        oia = self.oia
        started = oia[np.asarray(self.started_idx, dtype=np.intp)].tolist() if self.started_idx else []

        def positions() -> list[int]:
            pbi = np.zeros(n, dtype=np.int64)
            if started:
                keep = np.ones(n, dtype=bool)
                keep[started] = False
                pbi[oia] = np.cumsum(keep[oia])
            else:
                pbi[oia] = np.arange(1, n + 1)
            return pbi.tolist()

        def pending_in_order() -> list[SchedJob]:
            order = oia.tolist()
            if started:
                gone = set(started)
                return [queued[k] for k in order if k not in gone]
            return list(map(queued.__getitem__, order))

        # the context keeps nothing of the cycle alive but what estimates need
        default_rt = self.default_rt

        def runtime(job: SchedJob) -> float:
            return job.runtime_s or default_rt

        ctx = PositionContext(
            self.now,
            pending_in_order,
            self.idx.total_free_gpus + self.held_free_gpus,
            self.idx.total_gpus,
            self.releases(),
            runtime,
            extra,
            extra_text,
            extra_from,
        )
        first: dict[int, list[Reason]] = {}
        if self.explicit:
            where = oia[np.fromiter((p for p, _ in self.explicit), dtype=np.intp, count=len(self.explicit))].tolist()
            for k, (_, r) in zip(where, self.explicit):  # a later reason for the same job goes first
                first[k] = (r if isinstance(r, list) else [r]) + first.get(k, [])
        pending = PendingReasons(queued, started, first, positions, ctx)
        return Decisions(starts=self.starts, preemptions=self.preemptions, pending=pending, wake_at=self.wake_at())

    def wake_at(self) -> float | None:
        """``Decisions.wake_at``. A cycle that preempted (the room is not free yet) or cut its preemption search
        short may do more next time. Otherwise what stayed queued could not start on the capacity left, which only
        running jobs ending or new preemptions give back; :meth:`timed_wake` says when time alone changes that."""
        if self.preemptions or self.gave_up:
            return None
        return self.timed_wake()

    def timed_wake(self) -> float | None:
        """Subclasses: the earliest time at which time passing alone could let them start or preempt a job (inf:
        never); None: cannot tell."""
        return None

    def unstarted_min_gpus(self) -> int | None:
        """The fewest GPUs per replica of a job still queued after this cycle (None when none is)."""
        gs = self.g_sorted
        if self.started_idx:
            keep = np.ones(len(gs), dtype=bool)
            keep[self.started_idx] = False
            gs = gs[keep]
        return int(gs.min()) if len(gs) else None
