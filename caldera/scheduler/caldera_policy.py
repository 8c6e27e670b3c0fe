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

Limits that keep a cycle cheap and the cluster calm: at most ``max_preemptions_per_cycle`` new preemptions per
cycle (a storm, e.g. after a burst of high-priority submissions, is spread over a few cycles; each cycle's victims
are soon-free in the next); after 512 jobs in a row that could neither start, preempt nor reserve, preemption
search stops for the rest of the cycle (the jobs behind are less deserving and are reconsidered next cycle).

Quota keys and usage. Queue usage counts running jobs (terminating ones too) by ``cpu``, ``memory``, ``gpu`` and
``gpu/<model>`` of the GPUs they were given. Guarantee and deserved decisions look at GPUs only (``gpu/<model>`` when
the job asks for that model and the queue has a quota for it, else ``gpu``), count neither best-effort nor
terminating jobs, and a job without a GPU model can only reclaim through a ``gpu`` guarantee. CPU-only jobs never
preempt.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Iterable, Iterator
from itertools import count
from operator import attrgetter

import numpy as np

from caldera.core.resources import CPU, GPU, MEMORY
from caldera.core.tenancy import QueueConfig
from caldera.scheduler.engine import _RANK_BY_VALUE, CycleBase, Victim, rank_of
from caldera.scheduler.fairshare import FairShare
from caldera.scheduler.ordering import gpus_per_replica, queued_since, sort_order
from caldera.scheduler.quota import deserved
from caldera.scheduler.reasons import (
    BACKFILL_BLOCKED,
    PREEMPT_BEST_EFFORT,
    PREEMPT_PRIORITY,
    PREEMPT_RECLAIM,
    QUEUE_CAPABILITY,
    RESERVED,
    USER_CAP,
    WAITING_FOR_PREEMPTION,
    hhmm,
    num,
)
from caldera.scheduler.snapshot import Decisions, Preempt, Reason, SchedJob, Snapshot

_EPS = 1e-9
_GKEY = attrgetter("priority", "queue", "user")
_CLASS = {3: "high", 2: "normal", 1: "low", 0: "best-effort"}


def _VKEY(v: Victim) -> tuple[int, float]:
    return (v.rank, -v.started)


class _Queue:
    __slots__ = (
        "name",
        "cfg",
        "cap",
        "guar",
        "des",
        "max_gpus",
        "max_int",
        "max_run",
        "has_caps",
        "used",
        "used_nb",
        "chosen",
        "claimed",
        "rank_gpus",
        "groups",
        "gpu_keys_guar",
    )

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
        self.used: dict[str, float] = {}  # everything running, for capability
        self.used_nb: dict[str, float] = {}  # GPUs of running jobs that are not best-effort nor terminating
        self.chosen: dict[str, float] = {}  # GPUs of its jobs preempted in this cycle
        self.claimed: dict[str, float] = {}  # GPUs of its jobs waiting for preemptions in this cycle
        self.rank_gpus = [0, 0, 0, 0]  # GPUs of preemptable running jobs by priority rank
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
    ``fair_share`` (True; False orders by ``queued_since`` within a class), ``max_preemptions_per_cycle`` (32:
    a safety valve against preemption storms, e.g. after a burst of high-priority submissions; jobs that would need
    more wait for the next cycle, when the victims of this one are already counted as soon-free).
    """

    name = "caldera"

    def __init__(
        self,
        *,
        starvation_threshold_s: float | None = 300.0,
        default_runtime_estimate_s: float = 3600.0,
        max_reservations: int = 4,
        priority_preemption: bool = True,
        reclaim: bool = True,
        fair_share: bool = True,
        max_preemptions_per_cycle: int | None = 32,
    ) -> None:
        self.starvation_threshold_s = starvation_threshold_s
        self.default_runtime_estimate_s = float(default_runtime_estimate_s)
        self.max_reservations = int(max_reservations)
        self.priority_preemption = bool(priority_preemption)
        self.reclaim = bool(reclaim)
        self.fair_share = bool(fair_share)
        self.max_preemptions_per_cycle = max_preemptions_per_cycle

    def __call__(self, snapshot: Snapshot) -> Decisions:
        return _Cycle.decide(self, snapshot)


class _Cycle(CycleBase):
    def __init__(self, pol: CalderaPolicy, snap: Snapshot) -> None:
        super().__init__(snap, pol.default_runtime_estimate_s)
        self.pol = pol
        self.thr = pol.starvation_threshold_s
        self.queues: dict[str, _Queue] = {}
        self.users: dict[tuple[str, str], list[int]] = {}
        self._listed: list[tuple[SchedJob, int, int, str | None]] | None = []  # victims to be (see _setup_running)
        self.be_victims: list[Victim] = []  # best-effort, youngest first
        self.qvictims: dict[str, list[Victim]] = {}  # per queue, not best-effort: lowest class, youngest first
        self.be_avail = 0
        self._be_chosen = 0
        self.reclaimable = 0.0
        self.reservations: list[tuple[float, frozenset[int], str]] = []
        self.reserved_nodes: set[int] = set()
        self._excl_cache: dict[int, frozenset[int]] = {}
        self._excl_by_rt: dict[float | None, tuple[int, frozenset[int] | None, int]] = {}
        self._events_new: list[tuple[tuple, float]] = []
        self._events: list[tuple[float, int, int, float, int]] | None = None
        self.nofit: set[tuple] = set()
        self.nopre: set[tuple] = set()
        self._pot_cache: dict = {}
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
        """Usage per queue and user. The running jobs that could be preempted are only listed here; they become
        :class:`Victim` objects (:meth:`_ensure_victims`) the first time this cycle tries a preemption, which most
        cycles never do."""
        idx = self.idx
        users = self.users
        queues = self.queues
        rank_by = _RANK_BY_VALUE
        only_model = idx.models_sorted[0] if len(idx.models_sorted) == 1 else None
        on_index = idx.by_name
        listed = self._listed
        assert listed is not None, "running jobs are set up once per cycle"
        for job in self.snap.running:
            qn = job.queue
            q = queues.get(qn)
            if q is None:
                q = self.q(qn)
            req = job.request
            n = job.replicas
            gpus = req.gpu * n
            rank = rank_by[job.priority]
            model = None
            if gpus:
                model = req.gpu_model
                if model is None and job.allocations:
                    a = job.allocations[0]
                    if only_model is None:
                        model = idx.allocation_model(a)
                    elif a.gpus and a.node in on_index:
                        model = only_model
            if q.cap:  # what running jobs use matters only against a capability
                used = q.used
                used[CPU] = used.get(CPU, 0.0) + req.cpu * n
                used[MEMORY] = used.get(MEMORY, 0.0) + req.memory_mib * n
                if gpus:
                    used[GPU] = used.get(GPU, 0.0) + gpus
                    if model:
                        mk = GPU + "/" + model
                        used[mk] = used.get(mk, 0.0) + gpus
            if q.has_caps:  # and what each user runs, against user caps
                uk = (qn, job.user)
                us = users.get(uk)
                if us is None:
                    us = users[uk] = [0, 0, 0]
                us[0] += gpus
                if job.interactive:
                    us[1] += 1
                us[2] += 1
            if job.terminating:
                self.add_soon_free(Victim(job, rank, gpus, model))
                continue
            q.rank_gpus[rank] += gpus
            if not gpus:
                continue
            listed.append((job, rank, gpus, model))
            if rank == 0:
                self.be_avail += gpus
            else:
                nb = q.used_nb
                nb[GPU] = nb.get(GPU, 0.0) + gpus
                if model:
                    mk = GPU + "/" + model
                    nb[mk] = nb.get(mk, 0.0) + gpus
        self._contrib: dict[str, float] = {}
        self._update_reclaimable(self.queues)

    def _ensure_victims(self) -> None:
        """``be_victims`` (youngest first) and ``qvictims`` (per queue: lowest class, then youngest first)."""
        if self._listed is None:
            return
        be_victims = self.be_victims
        qvictims = self.qvictims
        for job, rank, gpus, model in self._listed:
            v = Victim(job, rank, gpus, model)
            if rank == 0:
                be_victims.append(v)
            else:
                lst = qvictims.get(job.queue)
                if lst is None:
                    lst = qvictims[job.queue] = []
                lst.append(v)
        self._listed = None
        be_victims.sort(key=lambda v: -v.started)
        for lst in qvictims.values():
            lst.sort(key=_VKEY)

    def all_victims(self) -> Iterator[Victim]:
        self._ensure_victims()
        yield from self.be_victims
        for lst in self.qvictims.values():
            yield from lst
        yield from self.anon
        for lst in self.directed.values():
            yield from lst

    def _update_reclaimable(self, names) -> None:
        """Upper bound of the GPUs reclaim could take: GPUs of queues above a deserved share (maintained per
        queue)."""
        contrib = self._contrib
        for name in names:
            q = self.queues[name]
            used = q.used_nb.get(GPU, 0.0) - q.chosen.get(GPU, 0.0)
            c = 0.0
            if used > 0 and (
                GPU not in q.des
                or any(
                    q.used_nb.get(k, 0.0) - q.chosen.get(k, 0.0) > d + _EPS
                    for k, d in q.des.items()
                    if k == GPU or k.startswith(GPU + "/")
                )
            ):
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
        # group = (priority, queue, user)
        gi = np.fromiter(map(gmap.__getitem__, map(_GKEY, queued)), dtype=np.intp, count=n)
        groups = list(gmap)
        G = len(groups)
        grank = [rank_of(pv) for pv, _, _ in groups]
        self.grank = grank
        self.gq = [self.q(qn) for _, qn, _ in groups]
        self.groups = groups
        if self.pol.fair_share and G:
            fs = FairShare(
                snap.queues,
                snap.queue_usage,
                snap.user_usage,
                {g[1] for g in groups} | {j.queue for j in snap.running},
                {g[2] for g in groups} | {j.user for j in snap.running},
            )
            cache: dict[tuple[str, str], float] = {}
            scores = []
            for _, qn, u in groups:
                s = cache.get((qn, u))
                if s is None:
                    s = cache[(qn, u)] = fs.score(qn, u)
                scores.append(s)
        else:
            scores = [0.0] * G
        # Queues below their GPU guarantee go first: a job of another queue started ahead of theirs would only be
        # reclaimed by them again (and, freed at once, started again: a ping-pong without end).
        owed = [0 if r > 0 and q.gpu_keys_guar and q.headroom_open() else 1 for r, q in zip(grank, self.gq)]
        ns = [(o, 3 - r, 1, s) for o, r, s in zip(owed, grank, scores)]
        st = [(o, 3 - r, 0, 0.0) if r > 0 else key for o, r, key in zip(owed, grank, ns)]
        dense = {k: i for i, k in enumerate(sorted(set(ns) | set(st)))}
        major_ns = np.array([dense[k] for k in ns], dtype=np.int64)
        major_s = np.array([dense[k] for k in st], dtype=np.int64)
        qs = queued_since(queued)
        maj = major_ns[gi] if n else np.zeros(0, dtype=np.int64)
        starving = None
        if self.thr is not None and n and self.pol.max_reservations > 0:
            starving = (qs <= (self.now - self.thr)) & (np.asarray(grank, dtype=np.int64)[gi] > 0)
            if starving.any():
                maj = np.where(starving, major_s[gi], maj)
            else:
                starving = None
        oia = sort_order(queued, qs, maj)
        self.oia = oia
        if starving is not None:
            self.must_see = starving[oia]  # starving jobs are looked at until the reservations run out
        self.k_sorted = gi[oia]
        self.g_sorted = gpus_per_replica(queued)[oia]
        self.ugroups: dict[tuple[str, str], list[int]] = {}
        for k, (_, qn, u) in enumerate(groups):
            self.gq[k].groups.append(k)
            self.ugroups.setdefault((qn, u), []).append(k)
        self.init_groups(G)
        self.qr_groups: dict[tuple[str, int], list[int]] = {}
        self.qr_open: dict[tuple[str, int], bool] = {}
        self._flags: tuple = ()
        for k, (_, qn, _user) in enumerate(groups):
            self.qr_groups.setdefault((qn, grank[k]), []).append(k)
        self.directed_groups: set[int] = set()
        for k in self.resolve_directed():
            gk = int(gi[k])
            self.directed_groups.add(gk)
            self.set_pre(gk, self.nmax)
        # a queue already at its GPU capability, a user already at a cap: block their groups up front
        for k, (_, qn, _user) in enumerate(groups):
            q = self.gq[k]
            cap = q.cap.get(GPU)
            if cap is not None and q.used.get(GPU, 0.0) >= cap - _EPS:
                self.block(k, self._capability_reason(q, GPU, q.used.get(GPU, 0.0), cap, 0), True)
            if q.has_caps:
                us = self.users.get((qn, u))
                if us is not None:
                    if q.max_run is not None and us[2] >= q.max_run:
                        self.block(k, self._user_reason("max_running_jobs", q.max_run, us[2], q, u), False)
                    elif q.max_gpus is not None and us[0] >= q.max_gpus:
                        self.block(k, self._user_reason("max_gpus", q.max_gpus, us[0], q, u), True)
        self._refresh_pre()

    def best_effort_group(self, group: int) -> bool:
        return self.grank[group] == 0

    def timed_wake(self) -> float | None:
        """Time reorders the queue (fair-share decay, starvation) and moves reservations. A reordered queue starts
        nothing on capacity none of its jobs fit and preempts nothing it could not preempt before, and a reservation
        only keeps jobs off nodes; so time matters only while reservations hold back capacity, or victims, that
        some waiting job might use. Apart from time: a job started in this cycle can take its queue over its
        deserved share, making that queue's jobs fair game for a reclaim by a queue below its guarantee that was
        looked at before the start."""
        if self.starts and self.pol.reclaim and any(q.groups and q.headroom_open() for q in self.queues.values()):
            return None
        if not self.reservations:
            return math.inf
        g = self.unstarted_min_gpus()
        if g is None:
            return math.inf
        if g == 0 or g <= self.idx.max_block() or self._could_preempt():
            return None
        return math.inf

    def _could_preempt(self) -> bool:
        """Whether any waiting job might preempt anyone, reservations aside: a best-effort job runs (or started in
        this cycle) while others wait, a queue with waiting jobs has a guarantee to reclaim with, or a queue runs
        jobs of a lower class than one it has waiting."""
        pol = self.pol
        lowest: dict[str, int] = {}  # queue -> lowest class of its running (and just started) GPU jobs
        for q in self.queues.values():
            for r in range(4):
                if q.rank_gpus[r]:
                    lowest[q.name] = r
                    break
        for job in self.started_jobs:
            if job.request.gpu:
                r = rank_of(job.priority)
                if r < lowest.get(job.queue, 4):
                    lowest[job.queue] = r
        waiting_ranks = [
            (q, max((self.grank[k] for k in q.groups), default=-1)) for q in self.queues.values() if q.groups
        ]
        if 0 in lowest.values() and any(r > 0 for _, r in waiting_ranks):
            return True
        for q, r in waiting_ranks:
            if pol.reclaim and q.gpu_keys_guar and r > 0:
                return True
            if pol.priority_preemption and 0 < lowest.get(q.name, 4) < r:
                return True
        return False

    def _explain(self, job: SchedJob, group: int) -> Reason:
        req = job.request
        g = req.gpu
        if self.reservations and g <= self.bres:
            _, rmask = self._exclusion(job)
            if rmask:
                shape = (g, req.gpu_model, req.cpu, req.memory_mib, job.replicas)
                bkey = (BACKFILL_BLOCKED, shape, rmask, None)
                if bkey not in self.nofit:
                    if self.idx.place(g, req.gpu_model, req.cpu, req.memory_mib, job.replicas) is not None:
                        return self._backfill_reason(job, rmask)
                    self.nofit.add(bkey)
        return super()._explain(job, group)

    def close_avenues(self) -> None:
        self._refresh_pre()

    def update_bfree(self) -> None:
        idx = self.idx
        if self.min_cpu is not None:
            mc, mm = self.min_cpu, self.min_mem or 0
            b = idx.max_block_where(mc, mm, self.reserved_nodes or None)
            r = idx.max_block_where(mc, mm, None) if self.reserved_nodes else 0
        elif self.reserved_nodes:
            b, r = idx.max_block_excluding(self.reserved_nodes), idx.max_block()
        else:
            b, r = idx.max_block(), 0
        if b != self.bfree or r != self.bres:
            self.bfree, self.bres = b, r
            self.mver += 1

    # ------------------------------------------------------------------------------------------------- avenues
    def _refresh_pre(self, queues: Iterable[str] | None = None) -> None:
        """Which groups could still preempt (or use soon-free capacity): ``pre[group]`` = largest node size or 0.
        Re-evaluated per (queue, priority rank); only for ``queues`` unless a cluster-wide avenue opened or closed."""
        pol = self.pol
        anon = self.anon_open > 0 and not self.gave_up
        cap = pol.max_preemptions_per_cycle
        more = (cap is None or len(self.preemptions) < cap) and not self.gave_up
        be = more and self.be_avail > 0
        rec = more and pol.reclaim and self.reclaimable > 0
        prio = more and pol.priority_preemption
        flags = (anon, be, rec, prio)
        if flags != self._flags or queues is None:
            self._flags = flags
            keys: Iterable[tuple[str, int]] = self.qr_groups
        else:
            qset = set(queues)
            keys = [key for key in self.qr_groups if key[0] in qset]
        nmax = self.nmax
        dg = self.directed_groups
        for key in keys:
            qn, r = key
            ok = anon
            if not ok and r > 0:
                q = self.queues[qn]
                ok = be or (rec and q.headroom_open()) or (prio and sum(q.rank_gpus[:r]) > 0)
            if ok == self.qr_open.get(key):
                continue
            self.qr_open[key] = ok
            for k in self.qr_groups[key]:
                self.set_pre(k, nmax if (ok or k in dg) else 0)

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
                    self.block(gk, r, False)
                return r
            if job.interactive and q.max_int is not None and us[1] >= q.max_int:
                return self._user_reason("max_interactive_jobs", q.max_int, us[1], q, job.user)
            if need_g and q.max_gpus is not None and us[0] + need_g > q.max_gpus:
                if us[0] >= q.max_gpus:
                    r = self._user_reason("max_gpus", q.max_gpus, us[0], q, job.user)
                    for gk in self.ugroups.get(uk, ()):
                        self.block(gk, r, True)
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
            preempting = self._preempt(job, q, rank, k, g, model, cpu, mem, n, excluded, exclude_models, shape, rmask)
            if preempting is not None:
                return preempting
        # 5. starvation: reservation
        if (
            self.thr is not None
            and len(self.reservations) < self.pol.max_reservations
            and self.now - (job.queued_since if job.queued_since is not None else job.submitted_at) >= self.thr
        ):
            reserved = self._reserve(job, g, model, cpu, mem, n, exclude_models)
            if reserved is not None:
                return reserved
        # 6. blocked by a reservation?
        if rmask:
            bkey = (BACKFILL_BLOCKED, shape, rmask, exclude_models)
            if bkey not in self.nofit:
                if idx.place(g, model, cpu, mem, n, None, exclude_models) is not None:
                    return self._backfill_reason(job, rmask)
                self.nofit.add(bkey)
        return self.nofit_reason(g, model, cpu, mem, n, excluded, exclude_models, False)

    def _start(self, job: SchedJob, q: _Queue, rank: int, plan, g: int, cpu: float, mem: int, n: int, k: int) -> None:
        allocs = self.start(job, plan, g, cpu, mem)
        gpus = g * n
        used = q.used
        if q.cap:
            used[CPU] = used.get(CPU, 0.0) + cpu * n
            used[MEMORY] = used.get(MEMORY, 0.0) + mem * n
        refresh = False
        if gpus:
            mk = GPU + "/" + plan[0]
            if q.cap:
                used[GPU] = used.get(GPU, 0.0) + gpus
                used[mk] = used.get(mk, 0.0) + gpus
            if rank > 0:
                was = q.gpu_keys_guar and self.reclaimable > 0 and q.headroom_open()
                nb = q.used_nb
                nb[GPU] = nb.get(GPU, 0.0) + gpus
                nb[mk] = nb.get(mk, 0.0) + gpus
                refresh = bool(was) and not q.headroom_open()
            cap = q.cap.get(GPU)
            if cap is not None and used[GPU] >= cap - _EPS:
                r = self._capability_reason(q, GPU, used[GPU], cap, 0)
                for gk in q.groups:
                    self.block(gk, r, True)
        if q.has_caps:
            uk = (job.queue, job.user)
            us = self.users[uk]
            us[0] += gpus
            us[1] += 1 if job.interactive else 0
            us[2] += 1
            if q.max_run is not None and us[2] >= q.max_run:
                r = self._user_reason("max_running_jobs", q.max_run, us[2], q, job.user)
                for gk in self.ugroups.get(uk, ()):
                    self.block(gk, r, False)
            elif gpus and q.max_gpus is not None and us[0] >= q.max_gpus:
                r = self._user_reason("max_gpus", q.max_gpus, us[0], q, job.user)
                for gk in self.ugroups.get(uk, ()):
                    self.block(gk, r, True)
        if self._events is not None:
            self._events_new.append((allocs, self.now + self.runtime_estimate(job)))
        if refresh:
            self._refresh_pre((q.name,))

    # ------------------------------------------------------------------------------------------------- preemption
    def _claim_key(self, q: _Queue, model: str | None) -> str:
        if model is not None:
            mk = GPU + "/" + model
            if mk in q.guar:
                return mk
        return GPU

    def _preempt(
        self,
        job: SchedJob,
        q: _Queue,
        rank: int,
        k: int,
        g: int,
        model: str | None,
        cpu: float,
        mem: int,
        n: int,
        excluded,
        exclude_models,
        shape,
        rmask,
    ) -> Reason | None:
        pol = self.pol
        need = g * n
        directed = [v for v in self.directed.get(job.id, ()) if not v.claimed] if self.directed else []
        # failing stays failing within a cycle: capacity, victims and eligibility only shrink
        pkey = (q.name, rank, shape, rmask, exclude_models)
        if not directed and pkey in self.nopre:
            return None
        ckey = self._claim_key(q, model)
        reclaim_ok = False
        if pol.reclaim and self.reclaimable > 0:
            gq = q.guar.get(ckey, 0.0)
            reclaim_ok = gq > 0 and (q.used_nb.get(ckey, 0.0) + q.claimed.get(ckey, 0.0) + need <= gq + _EPS)
        low = sum(q.rank_gpus[1:rank]) if pol.priority_preemption else 0
        bound: float = self.idx.free_gpus(model) + sum(v.gpus for v in directed) + self.anon_open + self.be_avail
        if reclaim_ok:
            bound += self.reclaimable
        bound += low
        if bound < need:
            return None
        if not directed and not self.anon_open and not self.be_avail and not reclaim_ok and not low:
            return None
        cap = pol.max_preemptions_per_cycle
        allow_new = (cap is None or len(self.preemptions) < cap) and not self.gave_up
        if not directed and not (allow_new or (self.anon_open and not self.gave_up)):
            return None
        cands = self._candidates(job, q, rank, model, ckey, reclaim_ok, directed, allow_new)
        got = self.try_with(
            g,
            model,
            cpu,
            mem,
            n,
            excluded,
            exclude_models,
            cands,
            self._potential(q, rank, reclaim_ok and allow_new, allow_new, directed),
        )
        if got is None:
            if not directed:
                self.nopre.add(pkey)
            return None
        plan, needed = got
        new = [v for v in needed if not v.soon]
        soon = [v for v in needed if v.soon]
        for v in soon:
            v.claimed = True
            if v in self.anon:
                self.anon_open -= v.gpus
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
        return Reason(
            WAITING_FOR_PREEMPTION,
            f"waiting for {len(ids)} preempted job{'s' if len(ids) != 1 else ''} ({what}) to release their resources",
            {"victims": ids, "new_preemptions": [v.id for v in new], "soon_free_gpus": sum(v.gpus for v in needed)},
        )

    def _node_gpus(self, victims: Iterable[Victim]) -> dict[int, int]:
        out: dict[int, int] = {}
        idx = self.idx
        for v in victims:
            if v.chosen or v.claimed:
                continue
            for i, m, _, _ in v.node_parts(idx):
                out[i] = out.get(i, 0) + m.bit_count()
        return out

    def _potential(self, q: _Queue, rank: int, reclaim: bool, allow_new: bool, directed: list[Victim]):
        """Upper bound, per node, of the GPUs this claimer could get there: free ones plus those of every victim it
        may take (built once per cycle per category; victims taken since only make it looser)."""
        self._ensure_victims()
        pc = self._pot_cache
        if "be" not in pc:
            pc["be"] = self._node_gpus(self.be_victims)
            pc["rec"] = self._node_gpus(
                v for name, lst in self.qvictims.items() if self._contrib.get(name, 0.0) > 0 for v in lst
            )
        parts = [self._anon_nodes]
        if allow_new:
            parts.append(pc["be"])
            if self.pol.priority_preemption and rank > 1:
                key = (q.name, rank)
                own = pc.get(key)
                if own is None:
                    own = pc[key] = self._node_gpus(v for v in self.qvictims.get(q.name, ()) if v.rank < rank)
                parts.append(own)
            if reclaim:
                parts.append(pc["rec"])
        if directed:
            parts.append(self._node_gpus(directed))
        free = self.idx.free

        def pot(i: int) -> int:
            t = free[i].bit_count()
            for d in parts:
                t += d.get(i, 0)
            return t

        return pot

    def _candidates(
        self,
        job: SchedJob,
        q: _Queue,
        rank: int,
        model: str | None,
        ckey: str,
        reclaim_ok: bool,
        directed: list[Victim],
        allow_new: bool = True,
    ) -> Iterator[Victim]:
        """Victims in preference order: soon-free ones first, then best-effort (youngest first), then the lowest
        class and youngest among lower classes of the same queue and, when reclaiming, jobs of queues above their
        deserved share."""
        yield from directed
        for v in self.anon:
            if not v.claimed and (model is None or v.model == model):
                yield v
        if not allow_new:
            return
        self._ensure_victims()
        if self._be_chosen > 32:
            self.be_victims = [v for v in self.be_victims if not v.chosen]
            self._be_chosen = 0
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
                taken += v.gpus  # tentatively: the queue must stay at its guarantee even if all go
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
            self._be_chosen += 1
            code = PREEMPT_BEST_EFFORT
            msg = (
                f"best-effort job {v.id} (queue {v.queue}) preempted by job {job.id} (queue {job.queue}, "
                f"{_CLASS[rank]}): best-effort jobs run only on idle capacity"
            )
        elif v.queue == job.queue:
            code = PREEMPT_PRIORITY
            msg = (
                f"job {v.id} ({_CLASS[v.rank]}) preempted by higher-priority job {job.id} ({_CLASS[rank]}) "
                f"in queue {job.queue}"
            )
        else:
            code = PREEMPT_RECLAIM
            sk = vq.share_key(ckey)
            vused = vq.used_nb.get(sk, 0.0) - vq.chosen.get(sk, 0.0)
            msg = (
                f"job {v.id} (queue {v.queue}, {_CLASS[v.rank]}) preempted by job {job.id} (queue {job.queue}): "
                f"queue {job.queue} is below its {ckey} guarantee ({num(q.used_nb.get(ckey, 0.0))} of "
                f"{num(q.guar.get(ckey, 0.0))} used) and queue {v.queue} is above its deserved share "
                f"({num(vused)} of {num(vq.des.get(sk, 0.0))})"
            )
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
                {"reserved_for": jid, "reserved_start": t, "max_runtime_s": rt},
            )
        return r

    def _event_tuples(self, allocs, t: float) -> list[tuple[float, int, int, float, int]]:
        idx = self.idx
        out = []
        for a in allocs:
            i = idx.by_name.get(a.node)
            if i is not None:
                out.append((max(t, self.now), i, idx._mask(i, a.gpus), a.cpu, a.memory_mib))
        return out

    def _build_events(self) -> list[tuple[float, int, int, float, int]]:
        """(time, node, device mask, cpu, memory) as resources are expected to free up, sorted."""
        idx = self.idx
        now = self.now
        rt = self.runtime_estimate
        ev: list[tuple[float, int, int, float, int]] = []
        seen: set[str] = set()
        # Victims matter only once this cycle preempted or claimed soon-free capacity (chosen ones free up now, the
        # unused rest of one is counted with it); until then every running job simply frees what it holds when it
        # ends, and no Victim objects are needed for that.
        for v in self.all_victims() if self.n_holds else ():
            if not v.allocs:  # the unused rest of a victim: already counted with it
                continue
            seen.add(v.id)
            job = v.job
            if job.terminating or v.chosen:
                t = now
            else:
                t = max(now, v.started + rt(job))
            for i, m, c, mm in v.node_parts(idx):
                ev.append((t, i, m, c, mm))
        for job in self.snap.running:  # the rest: CPU-only jobs, or everyone when no victim was touched
            if job.id in seen:
                continue
            st = job.started_at if job.started_at is not None else now
            t = now if job.terminating else max(now, st + rt(job))
            ev.extend(self._event_tuples(job.allocations, t))
        for st_, job in zip(self.starts, self.started_jobs):
            ev.extend(self._event_tuples(st_.allocations, now + rt(job)))
        self._events_new = []
        ev.sort()
        return ev

    def _reserve(
        self, job: SchedJob, g: int, model: str | None, cpu: float, mem: int, n: int, exclude_models
    ) -> Reason | None:
        if self._events is None:
            self._events = self._build_events()
        elif self._events_new:
            ev = list(self._events)
            for allocs, t in self._events_new:
                ev.extend(self._event_tuples(allocs, t))
            ev.sort()
            self._events = ev
            self._events_new = []
        idx = self.idx
        best: tuple[float, list[int]] | None = None
        pools = (
            [model]
            if model is not None
            else [m for m in idx.models_sorted if not (exclude_models and m in exclude_models)]
        )
        if g <= 0:
            return None
        reserved = self.reserved_nodes
        for m in pools:
            pool = idx.pools.get(m)
            if pool is None:
                continue
            state: dict[int, list] = {}  # node -> [free mask, cpu, memory, model mask], created on first use
            caps: dict[int, int] = {}
            total = 0
            for f in range(g, pool.maxf + 1):
                for i in pool.buckets[f]:
                    if i in reserved:
                        continue
                    c = idx._cap(i, f // g, cpu, mem)
                    if c:
                        caps[i] = c
                        total += c
            t_found = None
            if total >= n:
                t_found = self.now
            else:
                for t, i, mask, c_cpu, c_mem in self._events:
                    st = state.get(i)
                    if st is None:
                        if i in reserved:
                            continue
                        mm = 0
                        for m2, mask2 in idx.node_models[i]:
                            if m2 == m:
                                mm = mask2
                        if not mm:
                            continue
                        st = state[i] = [idx.free[i], idx.cpu[i], idx.mem[i], mm]
                    st[0] |= mask
                    st[1] += c_cpu
                    st[2] += c_mem
                    c = (st[0] & st[3]).bit_count() // g
                    if cpu > 0:
                        c = min(c, int((st[1] + _EPS) // cpu))
                    if mem > 0:
                        c = min(c, st[2] // mem)
                    c = max(c, 0)
                    total += c - caps.get(i, 0)
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
        self.horizon = max(self.horizon, t - self.now)
        if len(self.reservations) >= self.pol.max_reservations:
            self.must_see = None
        self.mver += 1
        self.update_bfree()
        names = [idx.names[i] for i in nodes]
        return Reason(
            RESERVED,
            f"resources reserved after waiting past {num(float(self.thr or 0))} s: expected to start at "
            f"{hhmm(t)} on {', '.join(names[:4])}{' and more' if len(names) > 4 else ''} as running jobs "
            f"reach their runtime limits",
            {"reserved_start": t, "nodes": names},
        )
