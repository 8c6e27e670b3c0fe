"""The ``caldera`` policy: multi-tenant quotas, priority classes, fair share, gang placement with reservations and
backfill, preemption and reclaim, and a reason for every waiting job.

Order. Jobs are taken by priority class (high, normal, low, best-effort). Within a class, jobs that have waited
longer than ``starvation_threshold_s`` come first (oldest first); the others follow by fair-share score of their
(queue, user) (:mod:`caldera.scheduler.fairshare`: less recent usage relative to the share goes first), ties by
``queued_since`` then id.

Admission, per job in that order:

1. user caps of its queue (``max_running_jobs``, ``max_interactive_jobs``, ``max_gpus``) -> ``UserCap``;
2. its queue's capability (hard ceiling) for every resource key it uses -> ``QueueCapability``; a job without a GPU
   model is kept off the models whose ``gpu/<model>`` capability it would exceed;
3. gang placement on free capacity, all replicas or none, packed and best fit (:mod:`placement`); nodes reserved
   for a starving job are used only by jobs whose ``max_runtime_s`` ends before the reservation;
4. otherwise, for a job that is not best-effort and needs GPUs: resources already being freed for it (terminating
   jobs with ``preempted_by`` == its id, or terminating with no ``preempted_by``) are counted first, then victims are
   added one at a time, lowest priority class first, youngest (latest ``started_at``) first, until the gang fits:

   * best-effort jobs, for anyone (``Preempt.reason`` ``BestEffort``);
   * reclaim: when the job's queue would still be within its GPU guarantee, jobs of other queues that are above
     their deserved share, as long as that queue stays at or above its own guarantee (``Reclaim``);
   * with ``priority_preemption`` (default on): lower priority classes of the same queue (``Priority``).

   The job then waits (``WaitingForPreemption``) and the free part of its placement is held for it during the
   cycle; next cycle the victims are ``terminating`` and counted as soon-free, so no more are preempted for it;
5. otherwise a job waiting past ``starvation_threshold_s`` gets a reservation: the earliest time enough nodes free
   up, from running jobs' ``started_at + max_runtime_s`` (``default_runtime_estimate_s`` when unknown) -> ``Reserved``;
   at most ``max_reservations`` per cycle;
6. otherwise ``BestEffortNoIdle`` (best-effort), ``BackfillBlocked`` (it fits only on reserved nodes) or
   ``GangNoFit``.

Every pending job also gets a ``QueuePosition`` reason (position and estimated start).

Quota keys and usage. Queue usage counts running jobs (terminating ones too) by ``cpu``, ``memory``, ``gpu`` and
``gpu/<model>`` of the GPUs they were given. Guarantee and deserved decisions look at GPUs only (``gpu/<model>`` when
the job asks for that model and the queue has a quota for it, else ``gpu``), count neither best-effort nor
terminating jobs, and a job without a GPU model can only reclaim through a ``gpu`` guarantee. CPU-only jobs never
preempt.
"""
from __future__ import annotations

import heapq
from collections import defaultdict
from itertools import count
from operator import attrgetter
from typing import Iterable, Iterator

import numpy as np

from caldera.core.resources import CPU, GPU, MEMORY
from caldera.core.tenancy import QueueConfig
from caldera.scheduler.engine import CycleBase, Victim, rank_of
from caldera.scheduler.fairshare import FairShare
from caldera.scheduler.ordering import gc_paused, queued_since, sort_order
from caldera.scheduler.quota import deserved
from caldera.scheduler.reasons import (
    BACKFILL_BLOCKED, BEST_EFFORT_NO_IDLE, GANG_NO_FIT, NEVER_FITS, PREEMPT_BEST_EFFORT, PREEMPT_PRIORITY,
    PREEMPT_RECLAIM, QUEUE_CAPABILITY, RESERVED, USER_CAP, WAITING_FOR_PREEMPTION, gpus_phrase, hhmm, num,
)
from caldera.scheduler.snapshot import Decisions, Preempt, Reason, SchedJob, Snapshot

_EPS = 1e-9
_GKEY = attrgetter("priority", "queue", "user", "request.gpu")
_RT = attrgetter("max_runtime_s")
_CLASS = {3: "high", 2: "normal", 1: "low", 0: "best-effort"}


def _VKEY(v: Victim) -> tuple[int, float]:
    return (v.rank, -v.started)


class _Queue:
    __slots__ = ("name", "cfg", "cap", "guar", "des", "max_gpus", "max_int", "max_run", "has_caps", "used",
                 "used_nb", "chosen", "claimed", "rank_gpus", "groups", "gpu_keys_guar")

    def __init__(self, name: str, cfg: QueueConfig | None) -> None:
        self.name = name
        self.cfg = cfg
        self.cap: dict[str, float] = {}
        self.guar: dict[str, float] = {}
        self.des: dict[str, float] = {}
        if cfg is not None:
            for key, qt in cfg.quotas.items():
                if qt.capability is not None:
                    self.cap[key] = float(qt.capability)
                if qt.guarantee > 0:
                    self.guar[key] = float(qt.guarantee)
                self.des[key] = float(deserved(qt))
            uc = cfg.user_caps
            self.max_gpus, self.max_int, self.max_run = uc.max_gpus, uc.max_interactive_jobs, uc.max_running_jobs
        else:
            self.max_gpus = self.max_int = self.max_run = None
        self.has_caps = self.max_gpus is not None or self.max_int is not None or self.max_run is not None
        self.gpu_keys_guar = [k for k in self.guar if k == GPU or k.startswith(GPU + "/")]
        self.used: dict[str, float] = {}        # everything running, for capability
        self.used_nb: dict[str, float] = {}     # GPUs of running jobs that are not best-effort nor terminating
        self.chosen: dict[str, float] = {}      # GPUs of its jobs preempted in this cycle
        self.claimed: dict[str, float] = {}     # GPUs of its jobs waiting for preemptions in this cycle
        self.rank_gpus = [0, 0, 0, 0]           # GPUs of preemptable running jobs by priority rank
        self.groups: list[int] = []

    def headroom_open(self) -> bool:
        for k in self.gpu_keys_guar:
            if self.guar[k] - self.used_nb.get(k, 0.0) - self.claimed.get(k, 0.0) >= 1 - _EPS:
                return True
        return False

    def share_key(self, key: str) -> str:
        return key if key in self.des else GPU

    def over_share(self, key: str, taken: float, gpus: int) -> bool:
        """Above its deserved share on ``key`` (net of this cycle's victims and ``taken`` more), and still at or
        above its guarantee after losing ``gpus`` more."""
        k = self.share_key(key)
        used = self.used_nb.get(k, 0.0) - self.chosen.get(k, 0.0) - taken
        return used > self.des.get(k, 0.0) + _EPS and used - gpus >= self.guar.get(k, 0.0) - _EPS


def _add(d: dict[str, float], k: str, x: float) -> None:
    d[k] = d.get(k, 0.0) + x


class CalderaPolicy:
    """Multi-tenant policy (see the module docstring).

    Options: ``starvation_threshold_s`` (300; None disables reservations and starvation ordering),
    ``default_runtime_estimate_s`` (3600; for running jobs without ``max_runtime_s``), ``max_reservations`` (4 per
    cycle), ``priority_preemption`` (True: a higher class preempts lower ones of the same queue), ``reclaim`` (True),
    ``fair_share`` (True; False orders by ``queued_since`` within a class).
    """

    name = "caldera"

    def __init__(self, *, starvation_threshold_s: float | None = 300.0, default_runtime_estimate_s: float = 3600.0,
                 max_reservations: int = 4, priority_preemption: bool = True, reclaim: bool = True,
                 fair_share: bool = True) -> None:
        self.starvation_threshold_s = starvation_threshold_s
        self.default_runtime_estimate_s = float(default_runtime_estimate_s)
        self.max_reservations = int(max_reservations)
        self.priority_preemption = bool(priority_preemption)
        self.reclaim = bool(reclaim)
        self.fair_share = bool(fair_share)

    def __call__(self, snapshot: Snapshot) -> Decisions:
        with gc_paused():
            cycle = _Cycle(self, snapshot)
            cycle.loop()
            return cycle.decisions()


class _Cycle(CycleBase):
    def __init__(self, pol: CalderaPolicy, snap: Snapshot) -> None:
        super().__init__(snap, pol.default_runtime_estimate_s)
        self.pol = pol
        self.thr = pol.starvation_threshold_s
        self.queues: dict[str, _Queue] = {}
        self.users: dict[tuple[str, str], list[int]] = {}
        self.be_victims: list[Victim] = []             # best-effort, youngest first
        self.qvictims: dict[str, list[Victim]] = {}     # per queue, not best-effort: lowest class, youngest first
        self.be_avail = 0
        self.reclaimable = 0.0
        self.reservations: list[tuple[float, frozenset[int], str]] = []
        self.reserved_nodes: set[int] = set()
        self._excl_cache: dict[int, frozenset[int]] = {}
        self._excl_by_rt: dict[float | None, tuple[int, frozenset[int] | None, int]] = {}
        self._events_new: list[tuple[float, int, int, float, int]] = []
        self._events: list[tuple[float, int, int, float, int]] | None = None
        self.nofit: set[tuple] = set()
        self.nopre: set[tuple] = set()
        self.max_pool = max((p.size for p in self.idx.pools.values()), default=0)
        self._setup_running()
        self._setup_order()

    # ------------------------------------------------------------------------------------------------- setup
    def q(self, name: str) -> _Queue:
        st = self.queues.get(name)
        if st is None:
            st = self.queues[name] = _Queue(name, self.snap.queues.get(name))
        return st

    def _setup_running(self) -> None:
        idx = self.idx
        users = self.users
        for job in self.snap.running:
            q = self.q(job.queue)
            req = job.request
            n = job.replicas
            gpus = req.gpu * n
            rank = rank_of(job.priority)
            model = req.gpu_model
            if gpus and model is None and job.allocations:
                model = idx.allocation_model(job.allocations[0])
            used = q.used
            _add(used, CPU, req.cpu * n)
            _add(used, MEMORY, req.memory_mib * n)
            if gpus:
                _add(used, GPU, gpus)
                if model:
                    _add(used, GPU + "/" + model, gpus)
            uk = (job.queue, job.user)
            us = users.get(uk)
            if us is None:
                us = users[uk] = [0, 0, 0]
            us[0] += gpus
            us[1] += 1 if job.interactive else 0
            us[2] += 1
            v = Victim(job, rank, gpus, model)
            if job.terminating:
                self.add_soon_free(v)
                continue
            if rank > 0 and gpus:
                _add(q.used_nb, GPU, gpus)
                if model:
                    _add(q.used_nb, GPU + "/" + model, gpus)
            q.rank_gpus[rank] += gpus
            if rank == 0:
                self.be_avail += gpus
            if gpus:
                if rank == 0:
                    self.be_victims.append(v)
                else:
                    self.qvictims.setdefault(job.queue, []).append(v)
        self.be_victims.sort(key=lambda v: -v.started)
        for lst in self.qvictims.values():
            lst.sort(key=_VKEY)
        self._contrib: dict[str, float] = {}
        self._update_reclaimable(self.queues)

    def _update_reclaimable(self, names) -> None:
        """Upper bound of the GPUs reclaim could take: GPUs of queues above a deserved share (maintained per
        queue)."""
        contrib = self._contrib
        for name in names:
            q = self.queues[name]
            used = q.used_nb.get(GPU, 0.0) - q.chosen.get(GPU, 0.0)
            c = 0.0
            if used > 0 and (GPU not in q.des or any(
                    q.used_nb.get(k, 0.0) - q.chosen.get(k, 0.0) > d + _EPS for k, d in q.des.items()
                    if k == GPU or k.startswith(GPU + "/"))):
                c = used
            old = contrib.get(name, 0.0)
            if c != old:
                contrib[name] = c
                self.reclaimable += c - old

    def _setup_order(self) -> None:
        snap = self.snap
        queued = snap.queued
        n = len(queued)
        gmap: defaultdict[tuple, int] = defaultdict(count().__next__)
        # one pass over the jobs: group = (priority, queue, user, GPUs per replica)
        gi = np.fromiter(map(gmap.__getitem__, map(_GKEY, queued)), dtype=np.intp, count=n)
        groups = list(gmap)
        G = len(groups)
        grank = [rank_of(pv) for pv, _, _, _ in groups]
        self.grank = grank
        self.gq = [self.q(qn) for _, qn, _, _ in groups]
        self.groups = groups
        if self.pol.fair_share and G:
            fs = FairShare(snap.queues, snap.queue_usage, snap.user_usage,
                           {g[1] for g in groups} | {j.queue for j in snap.running},
                           {g[2] for g in groups} | {j.user for j in snap.running})
            cache: dict[tuple[str, str], float] = {}
            scores = []
            for _, qn, u, _ in groups:
                s = cache.get((qn, u))
                if s is None:
                    s = cache[(qn, u)] = fs.score(qn, u)
                scores.append(s)
        else:
            scores = [0.0] * G
        keys = sorted({(3 - r, 1, s) for r, s in zip(grank, scores)} | {(3 - r, 0, 0.0) for r in grank})
        dense = {k: i for i, k in enumerate(keys)}
        major_ns = np.array([dense[(3 - r, 1, s)] for r, s in zip(grank, scores)], dtype=np.int64)
        major_s = np.array([dense[(3 - r, 0, 0.0)] if r > 0 else dense[(3 - r, 1, s)]
                            for r, s in zip(grank, scores)], dtype=np.int64)
        qs = queued_since(queued)
        maj = major_ns[gi] if n else np.zeros(0, dtype=np.int64)
        if self.thr is not None and n:
            starving = qs <= (self.now - self.thr)
            if starving.any():
                maj = np.where(starving, major_s[gi], maj)
        oia = sort_order(queued, qs, maj)
        self.oia = oia
        self.oi = oia.tolist()
        gis = gi[oia]
        self.gil = gis.tolist()
        self.gl = np.array([g for _, _, _, g in groups], dtype=np.int64)[gis].tolist() if n else []
        self.ugroups: dict[tuple[str, str], list[int]] = {}
        for k, (_, qn, u, _) in enumerate(groups):
            self.gq[k].groups.append(k)
            self.ugroups.setdefault((qn, u), []).append(k)
        self.gblock_all = [None] * G
        self.gblock_gpu = [None] * G
        self.pre = [0] * G
        self.npre = 0
        self.qr_groups: dict[tuple[str, int], list[int]] = {}
        self.qr_open: dict[tuple[str, int], bool] = {}
        self._flags: tuple = ()
        for k, (_, qn, u, _) in enumerate(groups):
            self.qr_groups.setdefault((qn, grank[k]), []).append(k)
        self.directed_groups: set[int] = set()
        for k in self.directed_inputs():
            gk = int(gi[k])
            self.directed_groups.add(gk)
            self.pre[gk] = self.nmax
        self.npre = len(self.directed_groups)
        # a queue already at its GPU capability, a user already at a cap: block their groups up front
        for k, (_, qn, u, _) in enumerate(groups):
            q = self.gq[k]
            cap = q.cap.get(GPU)
            if cap is not None and q.used.get(GPU, 0.0) >= cap - _EPS:
                self.gblock_gpu[k] = self._capability_reason(q, GPU, q.used.get(GPU, 0.0), cap, 0)
            if q.has_caps:
                us = self.users.get((qn, u))
                if us is not None:
                    if q.max_run is not None and us[2] >= q.max_run:
                        self.gblock_all[k] = self._user_reason("max_running_jobs", q.max_run, us[2], q, u)
                    elif q.max_gpus is not None and us[0] >= q.max_gpus:
                        self.gblock_gpu[k] = self._user_reason("max_gpus", q.max_gpus, us[0], q, u)
        self._refresh_pre()

    def update_bfree(self) -> None:
        idx = self.idx
        if self.reserved_nodes:
            self.bres = idx.max_block()
            self.bfree = idx.max_block_excluding(self.reserved_nodes)
        else:
            self.bfree = idx.max_block()

    # ------------------------------------------------------------------------------------------------- avenues
    def _refresh_pre(self, queues: Iterable[str] | None = None) -> None:
        """Which groups could still preempt (or use soon-free capacity): ``pre[group]`` = largest node size or 0.
        Re-evaluated per (queue, priority rank); only for ``queues`` unless a cluster-wide avenue opened or closed."""
        pol = self.pol
        anon = self.anon_open > 0
        be = self.be_avail > 0
        rec = pol.reclaim and self.reclaimable > 0
        flags = (anon, be, rec)
        if flags != self._flags or queues is None:
            self._flags = flags
            keys: Iterable[tuple[str, int]] = self.qr_groups
        else:
            qset = set(queues)
            keys = [key for key in self.qr_groups if key[0] in qset]
        nmax = self.nmax
        pre = self.pre
        dg = self.directed_groups
        for key in keys:
            qn, r = key
            ok = anon
            if not ok and r > 0:
                q = self.queues[qn]
                ok = be or (rec and q.headroom_open()) or (pol.priority_preemption and sum(q.rank_gpus[:r]) > 0)
            if ok == self.qr_open.get(key):
                continue
            self.qr_open[key] = ok
            for k in self.qr_groups[key]:
                v = nmax if (ok or k in dg) else 0
                if v and not pre[k]:
                    self.npre += 1
                elif pre[k] and not v:
                    self.npre -= 1
                pre[k] = v

    # ------------------------------------------------------------------------------------------------- reasons
    def _user_reason(self, cap: str, limit: int, used: int, q: _Queue, user: str, need: int = 0) -> Reason:
        key = (USER_CAP, cap, limit, used, need, q.name, user)
        r = self.rcache.get(key)
        if r is None:
            if cap == "max_gpus":
                msg = f"user cap of {limit} GPUs reached"
                if used < limit:
                    msg += f" ({used} in use, this job needs {need})"
            elif cap == "max_interactive_jobs":
                msg = f"user cap of {limit} interactive jobs reached"
            else:
                msg = f"user cap of {limit} running jobs reached"
            d = {"cap": cap, "limit": limit, "used": used, "queue": q.name, "user": user}
            if need:
                d["requested"] = need
            r = self.rcache[key] = Reason(USER_CAP, msg, d)
        return r

    def _capability_reason(self, q: _Queue, key: str, used: float, cap: float, need: float) -> Reason:
        ck = (QUEUE_CAPABILITY, q.name, key, used, need)
        r = self.rcache.get(ck)
        if r is None:
            msg = f"queue at its capability for {key} ({num(used)} of {num(cap)} used)"
            if need and used < cap - _EPS:
                msg += f", this job needs {num(need)}"
            d = {"resource": key, "used": num(used), "limit": num(cap), "queue": q.name}
            if need:
                d["requested"] = num(need)
            r = self.rcache[ck] = Reason(QUEUE_CAPABILITY, msg, d)
        return r

    # ------------------------------------------------------------------------------------------------- per job
    def consider(self, job: SchedJob, k: int) -> Reason | list[Reason] | None:
        req = job.request
        g = req.gpu
        n = job.replicas
        model = req.gpu_model
        cpu = req.cpu
        mem = req.memory_mib
        q = self.gq[k]
        rank = self.grank[k]
        idx = self.idx
        need_g = g * n
        # never: bigger than any node or the whole cluster
        if g and (g > self.nmax or need_g > self.max_pool or model is not None) and self.never_quick(g, model, n):
            return self.never(job, g, model, n)
        # 1. user caps
        us = None
        if q.has_caps:
            uk = (job.queue, job.user)
            us = self.users.get(uk)
            if us is None:
                us = self.users[uk] = [0, 0, 0]
            if q.max_run is not None and us[2] >= q.max_run:
                r = self._user_reason("max_running_jobs", q.max_run, us[2], q, job.user)
                for gk in self.ugroups.get(uk, ()):
                    self.gblock_all[gk] = r
                return r
            if job.interactive and q.max_int is not None and us[1] >= q.max_int:
                return self._user_reason("max_interactive_jobs", q.max_int, us[1], q, job.user)
            if need_g and q.max_gpus is not None and us[0] + need_g > q.max_gpus:
                if us[0] >= q.max_gpus:
                    r = self._user_reason("max_gpus", q.max_gpus, us[0], q, job.user)
                    for gk in self.ugroups.get(uk, ()):
                        self.gblock_gpu[gk] = r
                    return r
                return self._user_reason("max_gpus", q.max_gpus, us[0], q, job.user, need_g)
        # 2. queue capability
        exclude_models: frozenset[str] | None = None
        if q.cap:
            used = q.used
            ex: set[str] | None = None
            for key, cap in q.cap.items():
                if key == CPU:
                    need = cpu * n
                elif key == MEMORY:
                    need = float(mem * n)
                elif key == GPU:
                    need = need_g
                else:
                    if not need_g:
                        continue
                    if model is None:
                        if used.get(key, 0.0) + need_g > cap + _EPS:
                            if ex is None:
                                ex = set()
                            ex.add(key[4:])
                        continue
                    need = need_g if key == GPU + "/" + model else 0
                if need and used.get(key, 0.0) + need > cap + _EPS:
                    return self._capability_reason(q, key, used.get(key, 0.0), cap, need)
            if ex:
                if all(m in ex for m in idx.pools):
                    key = GPU + "/" + sorted(ex)[0]
                    return self._capability_reason(q, key, used.get(key, 0.0), q.cap[key], need_g)
                exclude_models = frozenset(ex)
        # 3. placement on free capacity, respecting reservations
        excluded, rmask = self._exclusion(job) if self.reservations else (None, 0)
        shape = (g, model, cpu, mem, n)
        fkey = (shape, rmask, exclude_models)
        if fkey not in self.nofit:
            plan = idx.place(g, model, cpu, mem, n, excluded, exclude_models)
            if plan is not None:
                self._start(job, q, rank, plan, g, cpu, mem, n, k)
                return None
            self.nofit.add(fkey)
        if rank == 0:
            return self.nofit_reason(g, model, cpu, mem, n, excluded, exclude_models, True)
        # 4. soon-free capacity and preemption
        if need_g:
            r = self._preempt(job, q, rank, k, g, model, cpu, mem, n, excluded, exclude_models, shape, rmask)
            if r is not None:
                return r
        # 5. starvation: reservation
        if (self.thr is not None and len(self.reservations) < self.pol.max_reservations
                and self.now - (job.queued_since if job.queued_since is not None else job.submitted_at) >= self.thr):
            r = self._reserve(job, g, model, cpu, mem, n, exclude_models)
            if r is not None:
                return r
        # 6. blocked by a reservation?
        if rmask:
            bkey = (BACKFILL_BLOCKED, shape, rmask, exclude_models)
            if bkey not in self.nofit:
                if idx.place(g, model, cpu, mem, n, None, exclude_models) is not None:
                    return self._backfill_reason(job, rmask)
                self.nofit.add(bkey)
        return self.nofit_reason(g, model, cpu, mem, n, excluded, exclude_models, False)

    def _start(self, job: SchedJob, q: _Queue, rank: int, plan, g: int, cpu: float, mem: int, n: int,
               k: int) -> None:
        self.start(job, plan, g, cpu, mem)
        gpus = g * n
        used = q.used
        _add(used, CPU, cpu * n)
        _add(used, MEMORY, float(mem * n))
        refresh = False
        if gpus:
            mk = GPU + "/" + plan[0]
            _add(used, GPU, gpus)
            _add(used, mk, gpus)
            if rank > 0:
                was = bool(q.gpu_keys_guar) and self.reclaimable > 0 and q.headroom_open()
                _add(q.used_nb, GPU, gpus)
                _add(q.used_nb, mk, gpus)
                refresh = was and not q.headroom_open()
            cap = q.cap.get(GPU)
            if cap is not None and used[GPU] >= cap - _EPS:
                r = self._capability_reason(q, GPU, used[GPU], cap, 0)
                for gk in q.groups:
                    self.gblock_gpu[gk] = r
        if q.has_caps:
            uk = (job.queue, job.user)
            us = self.users[uk]
            us[0] += gpus
            us[1] += 1 if job.interactive else 0
            us[2] += 1
            if q.max_run is not None and us[2] >= q.max_run:
                r = self._user_reason("max_running_jobs", q.max_run, us[2], q, job.user)
                for gk in self.ugroups.get(uk, ()):
                    self.gblock_all[gk] = r
            elif gpus and q.max_gpus is not None and us[0] >= q.max_gpus:
                r = self._user_reason("max_gpus", q.max_gpus, us[0], q, job.user)
                for gk in self.ugroups.get(uk, ()):
                    self.gblock_gpu[gk] = r
        if self._events is not None:
            self._add_events(self.starts[-1].allocations, self.now + self.runtime_estimate(job))
        if refresh:
            self._refresh_pre((q.name,))

    # ------------------------------------------------------------------------------------------------- preemption
    def _claim_key(self, q: _Queue, model: str | None) -> str:
        if model is not None:
            mk = GPU + "/" + model
            if mk in q.guar:
                return mk
        return GPU

    def _preempt(self, job: SchedJob, q: _Queue, rank: int, k: int, g: int, model: str | None, cpu: float,
                 mem: int, n: int, excluded, exclude_models, shape, rmask) -> Reason | None:
        pol = self.pol
        need = g * n
        directed = [v for v in self.directed.get(job.id, ()) if not v.claimed]
        ckey = self._claim_key(q, model)
        reclaim_ok = False
        if pol.reclaim and self.reclaimable > 0:
            gq = q.guar.get(ckey, 0.0)
            reclaim_ok = gq > 0 and (q.used_nb.get(ckey, 0.0) + q.claimed.get(ckey, 0.0) + need <= gq + _EPS)
        low = sum(q.rank_gpus[1:rank]) if pol.priority_preemption else 0
        bound = self.idx.free_gpus(model) + sum(v.gpus for v in directed) + self.anon_open + self.be_avail
        if reclaim_ok:
            bound += self.reclaimable
        bound += low
        if bound < need:
            return None
        if not directed and not self.anon_open and not self.be_avail and not reclaim_ok and not low:
            return None
        pkey = (q.name, rank, shape, rmask, exclude_models, reclaim_ok)
        if not directed and pkey in self.nopre:
            return None
        cands = self._candidates(job, q, rank, model, ckey, reclaim_ok, directed)
        got = self.try_with(g, model, cpu, mem, n, excluded, exclude_models, cands)
        if got is None:
            if not directed:
                self.nopre.add(pkey)
            return None
        plan, needed = got
        new = [v for v in needed if not v.job.terminating]
        soon = [v for v in needed if v.job.terminating]
        for v in soon:
            v.claimed = True
            if not v.job.preempted_by:
                self.anon_open -= max(v.gpus, 1)
        for v in new:
            self._choose(v, job, q, rank, ckey)
        _add(q.claimed, GPU, need)
        if plan[0] is not None and ckey != GPU:
            _add(q.claimed, ckey, need)
        if new or soon:
            touched = {q.name, *(v.queue for v in new)}
            self._update_reclaimable(touched)
            self._refresh_pre(touched)
        ids = [v.id for v in needed]
        what = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
        return Reason(WAITING_FOR_PREEMPTION,
                      f"waiting for {len(ids)} preempted job{'s' if len(ids) != 1 else ''} ({what}) to release "
                      f"their resources",
                      {"victims": ids, "new_preemptions": [v.id for v in new],
                       "soon_free_gpus": sum(v.gpus for v in needed)})

    def _candidates(self, job: SchedJob, q: _Queue, rank: int, model: str | None, ckey: str, reclaim_ok: bool,
                    directed: list[Victim]) -> Iterator[Victim]:
        """Victims in preference order: soon-free ones first, then best-effort (youngest first), then the lowest
        class and youngest among lower classes of the same queue and, when reclaiming, jobs of queues above their
        deserved share."""
        yield from directed
        for v in self.anon:
            if not v.claimed and (model is None or v.model == model):
                yield v
        for v in self.be_victims:
            if not v.chosen and (model is None or v.model == model):
                yield v
        gens = []
        if self.pol.priority_preemption and rank > 1:
            own = self.qvictims.get(q.name)
            if own:
                gens.append(self._lower(own, rank, model))
        if reclaim_ok:
            for name, lst in self.qvictims.items():
                if name != q.name and lst and self._contrib.get(name, 0.0) > 0:
                    gens.append(self._over(self.queues[name], lst, ckey, model))
        if len(gens) == 1:
            yield from gens[0]
        elif gens:
            yield from heapq.merge(*gens, key=_VKEY)

    @staticmethod
    def _lower(lst: list[Victim], rank: int, model: str | None) -> Iterator[Victim]:
        for v in lst:
            if v.rank >= rank:
                return
            if not v.chosen and (model is None or v.model == model):
                yield v

    @staticmethod
    def _over(vq: _Queue, lst: list[Victim], ckey: str, model: str | None) -> Iterator[Victim]:
        taken = 0
        for v in lst:
            if v.chosen or (model is not None and v.model != model):
                continue
            if vq.over_share(ckey, taken, v.gpus):
                taken += v.gpus      # tentatively: the queue must stay at its guarantee even if all go
                yield v
            elif not vq.over_share(ckey, taken, 0):
                return

    def _choose(self, v: Victim, job: SchedJob, q: _Queue, rank: int, ckey: str) -> None:
        v.chosen = True
        self.chosen.append(v)
        vq = self.queues[v.queue]
        vq.rank_gpus[v.rank] -= v.gpus
        if v.rank == 0:
            self.be_avail -= v.gpus
            code = PREEMPT_BEST_EFFORT
            msg = (f"best-effort job {v.id} (queue {v.queue}) preempted by job {job.id} (queue {job.queue}, "
                   f"{_CLASS[rank]}): best-effort jobs run only on idle capacity")
        elif v.queue == job.queue:
            code = PREEMPT_PRIORITY
            msg = (f"job {v.id} ({_CLASS[v.rank]}) preempted by higher-priority job {job.id} ({_CLASS[rank]}) "
                   f"in queue {job.queue}")
        else:
            code = PREEMPT_RECLAIM
            sk = vq.share_key(ckey)
            vused = vq.used_nb.get(sk, 0.0) - vq.chosen.get(sk, 0.0)
            msg = (f"job {v.id} (queue {v.queue}, {_CLASS[v.rank]}) preempted by job {job.id} (queue {job.queue}): "
                   f"queue {job.queue} is below its {ckey} guarantee ({num(q.used_nb.get(ckey, 0.0))} of "
                   f"{num(q.guar.get(ckey, 0.0))} used) and queue {v.queue} is above its deserved share "
                   f"({num(vused)} of {num(vq.des.get(sk, 0.0))})")
        if v.rank > 0 and v.gpus:
            _add(vq.chosen, GPU, v.gpus)
            if v.model:
                _add(vq.chosen, GPU + "/" + v.model, v.gpus)
        self.preemptions.append(Preempt(v.id, job.id, code, msg))

    # ------------------------------------------------------------------------------------------------- reservations
    def _exclusion(self, job: SchedJob) -> tuple[frozenset[int] | None, int]:
        rt = job.max_runtime_s
        hit = self._excl_by_rt.get(rt)
        if hit is not None and hit[0] == len(self.reservations):
            return hit[1], hit[2]
        end = self.now + rt if rt else float("inf")
        mask = 0
        for b, (t, _, jid) in enumerate(self.reservations):
            if end > t and jid != job.id:
                mask |= 1 << b
        if not mask:
            self._excl_by_rt[rt] = (len(self.reservations), None, 0)
            return None, 0
        ex = self._excl_cache.get(mask)
        if ex is None:
            s: set[int] = set()
            for b, (_, nodes, _) in enumerate(self.reservations):
                if mask >> b & 1:
                    s |= nodes
            ex = self._excl_cache[mask] = frozenset(s)
        self._excl_by_rt[rt] = (len(self.reservations), ex, mask)
        return ex, mask

    def _backfill_reason(self, job: SchedJob, rmask: int) -> Reason:
        b = (rmask & -rmask).bit_length() - 1
        t, _, jid = self.reservations[b]
        rt = job.max_runtime_s
        limit = "it has no runtime limit" if not rt else f"its runtime limit ({num(float(rt))} s) ends after that"
        key = (BACKFILL_BLOCKED, jid, rt)
        r = self.rcache.get(key)
        if r is None:
            r = self.rcache[key] = Reason(
                BACKFILL_BLOCKED,
                f"would fit now, but the free resources are reserved for job {jid} from {hhmm(t)} and {limit}",
                {"reserved_for": jid, "reserved_start": t, "max_runtime_s": rt})
        return r

    def _add_events(self, allocs, t: float) -> None:
        idx = self.idx
        for a in allocs:
            i = idx.by_name.get(a.node)
            if i is not None:
                self._events_new.append((max(t, self.now), i, idx._mask(i, a.gpus), a.cpu, a.memory_mib))

    def _build_events(self) -> list[tuple[float, int, int, float, int]]:
        idx = self.idx
        now = self.now
        chosen = {v.id for v in self.chosen}
        ev: list[tuple[float, int, int, float, int]] = []
        for job in self.snap.running:
            if job.terminating or job.id in chosen:
                t = now
            else:
                st = job.started_at if job.started_at is not None else now
                t = max(now, st + self.runtime_estimate(job))
            for a in job.allocations:
                i = idx.by_name.get(a.node)
                if i is not None:
                    ev.append((t, i, idx._mask(i, a.gpus), a.cpu, a.memory_mib))
        for st, job in zip(self.starts, self.started_jobs):
            t = now + self.runtime_estimate(job)
            for a in st.allocations:
                i = idx.by_name.get(a.node)
                if i is not None:
                    ev.append((t, i, idx._mask(i, a.gpus), a.cpu, a.memory_mib))
        ev.sort()
        return ev

    def _reserve(self, job: SchedJob, g: int, model: str | None, cpu: float, mem: int, n: int,
                 exclude_models) -> Reason | None:
        if self._events is None:
            self._events = self._build_events()
        elif self._events_new:
            self._events = sorted(self._events + self._events_new)
            self._events_new = []
        idx = self.idx
        best: tuple[float, list[int]] | None = None
        pools = [model] if model is not None else [m for m in idx.models_sorted
                                                   if not (exclude_models and m in exclude_models)]
        if g <= 0:
            return None
        for m in pools:
            pool = idx.pools.get(m)
            if pool is None:
                continue
            state: dict[int, list] = {}
            caps: dict[int, int] = {}
            total = 0
            for f, bucket in enumerate(pool.buckets):
                for i in bucket:
                    if i in self.reserved_nodes:
                        continue
                    mmask = next(mask for mm, mask in idx.node_models[i] if mm == m)
                    st = [idx.free[i], idx.cpu[i], idx.mem[i], mmask]
                    state[i] = st
                    c = idx._cap(i, f // g, cpu, mem) if f >= g else 0
                    caps[i] = c
                    total += c
            t_found = None
            if total >= n:
                t_found = self.now
            else:
                for t, i, mask, c_cpu, c_mem in self._events:
                    st = state.get(i)
                    if st is None:
                        continue
                    st[0] |= mask
                    st[1] += c_cpu
                    st[2] += c_mem
                    f = (st[0] & st[3]).bit_count()
                    c = f // g
                    if cpu > 0:
                        c = min(c, int((st[1] + _EPS) // cpu))
                    if mem > 0:
                        c = min(c, st[2] // mem)
                    c = max(c, 0)
                    total += c - caps[i]
                    caps[i] = c
                    if total >= n:
                        t_found = t
                        break
            if t_found is None:
                continue
            if best is not None and t_found >= best[0]:
                continue
            # nodes for the gang at that time: as few as possible, best fit for the last one
            cand = sorted((c, i) for i, c in caps.items() if c > 0)
            chosen: list[int] = []
            r = n
            while r > 0 and cand:
                whole = [(c, i) for c, i in cand if c >= r]
                c, i = whole[0] if whole else cand[-1]
                chosen.append(i)
                cand.remove((c, i))
                r -= min(c, r)
            if r > 0:
                continue
            best = (t_found, chosen)
        if best is None:
            return None
        t, nodes = best
        self.reservations.append((t, frozenset(nodes), job.id))
        self.reserved_nodes.update(nodes)
        if self.rtl is None:
            rt = np.array(list(map(_RT, self.queued)), dtype=np.float64)
            rt[np.isnan(rt)] = np.inf
            self.rtl = rt[self.oia].tolist()
        self.horizon = max(self.horizon, t - self.now)
        self.update_bfree()
        names = [idx.names[i] for i in nodes]
        return Reason(RESERVED,
                      f"resources reserved after waiting past {num(float(self.thr))} s: expected to start at "
                      f"{hhmm(t)} on {', '.join(names[:4])}{' and more' if len(names) > 4 else ''} as running jobs "
                      f"reach their runtime limits",
                      {"reserved_start": t, "nodes": names})
