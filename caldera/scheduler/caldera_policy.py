"""The ``caldera`` policy: multi-tenant quotas, priority classes, fair share, gang placement with reservations and
backfill, preemption and reclaim, and a reason for every waiting job.

Order (:mod:`caldera_ordering`). Jobs of queues below their GPU guarantee come first (what they are owed would
otherwise be started for others and reclaimed back), then by priority class (high, normal, low, best-effort). Within
a class, by attained-service level (least-attained-service, below); within a level batch jobs with less attained
service first (``within_level="attained"``, the default: among jobs that already ran, the one that ran least is
likelier to finish soon; ``"fair_share"`` skips this key), then by fair-share score of their (queue, user)
(:mod:`caldera.scheduler.fairshare`: less recent usage relative to the share goes first), ties by
``queued_since`` then id. With reservations on, jobs that have waited longer than ``starvation_threshold_s`` are
put in the lowest level.

Admission, per job in that order (:mod:`caldera_admission`, :mod:`caldera_preemption`,
:mod:`caldera_reservations`):

1. user caps of its queue (``max_running_jobs``, ``max_interactive_jobs``, ``max_gpus``) -> ``UserCap``;
2. its queue's capability (hard ceiling) for every resource key it uses -> ``QueueCapability``; a job without a GPU
   model is kept off the models whose ``gpu/<model>`` capability it would exceed;
3. gang placement on free capacity, all replicas or none, packed and best fit (:mod:`placement`; with
   ``speed_placement``, first on the GPU model it runs fastest on among those where it fits now, from
   ``SchedJob.speeds``); nodes reserved
   for a starving job are used only by jobs whose ``max_runtime_s`` ends before the reservation;
4. otherwise, for a job that needs GPUs (a best-effort one only through least-attained-service, below): resources
   already being freed for it (terminating jobs with ``preempted_by`` == its id, or terminating with no
   ``preempted_by``) are counted first, then victims are added one at a time, lowest priority class first, youngest
   (latest ``started_at``) first, until the gang fits:

   * best-effort batch jobs, for anyone not best-effort (``Preempt.reason`` ``BestEffort``; an interactive job,
     whatever its class, only ever to reclaim a guarantee); with ``best_effort_grace_s``, only for a job that has
     waited that long (and with ``best_effort_grace_scope="all"`` such a job makes no least-attained-service
     preemption either while best-effort jobs hold GPUs; its ``GangNoFit`` reason says when the grace ends);
   * reclaim: when the job's queue would still be within its GPU guarantee, jobs of other queues that are above
     their deserved share, as long as that queue stays at or above its own guarantee (``Reclaim``);
   * with ``priority_preemption`` (default on): lower priority classes of the same queue (``Priority``).
   * least-attained-service (``LeastAttainedService``): batch jobs (not interactive, spec ``preemptible`` not
     false) of a class no higher than the job's, in a higher attained-service level than the job's, that have run
     ``las_min_run_s`` since their last start: of any queue that stays at its guarantee (``las_across_queues``
     ``"guarantee"``, the default), or only of the job's own queue and queues above their deserved share
     (``"share"``). Highest level first, then the job with the most GPUs (fewer jobs pay a restart for the
     same room: on Philly 20 x 8 this took 275 preemptions to 92 and average JCT from 28.7 h to 26.8 h), then
     the youngest (latest ``started_at``, ``las_victims_by="youngest"``, the default: the job that has run
     longest keeps running, so the longest jobs are not all put off to the end, which stretched the makespan
     8.6% past Tiresias' on Alibaba 2 x 8; see docs/scheduler-efficiency.md) or the most attained service
     (``"attained"``: the mirror of the queue's order).
     Within a class and tier, jobs are also ordered by level.
   * a best-effort job (``las_best_effort``) takes only best-effort batch jobs running as such in a higher
     attained-service level (``LeastAttainedService``), never a higher class or a job that aging promoted; a
     best-effort job that aging promoted takes best-effort jobs only that way too.
   * a job already preempted ``max_preemptions_per_job`` times (``SchedJob.preemptions``) is no
     least-attained-service victim any more, of either kind: it runs to its end unless a guarantee, a higher class
     or (as a best-effort job) a job of a higher class needs its GPUs.

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

import math
from bisect import bisect_right

from caldera.core.resources import CPU, GPU, MEMORY
from caldera.scheduler.caldera_admission import _Queue
from caldera.scheduler.caldera_aging import promote_starved_batch, promote_waiting
from caldera.scheduler.caldera_options import EPS, CalderaOptions
from caldera.scheduler.caldera_ordering import Ordering
from caldera.scheduler.engine import _RANK_BY_VALUE, Victim
from caldera.scheduler.reasons import (
    BACKFILL_BLOCKED,
)
from caldera.scheduler.snapshot import Decisions, Reason, SchedJob, Snapshot


class CalderaPolicy(CalderaOptions):
    """Multi-tenant policy (see the module docstring; its settings: :class:`CalderaOptions`)."""

    name = "caldera"

    def __call__(self, snapshot: Snapshot) -> Decisions:
        next_promotion = math.inf
        if self.aging_threshold_s is not None:
            snapshot = promote_waiting(snapshot, self.aging_threshold_s, self.aging_factor)
        if self.las_starvation_factor is not None and self.las_thresholds_gpu_s is not None:
            cap = math.inf if self.las_starvation_max_wait_s is None else self.las_starvation_max_wait_s
            snapshot, next_promotion = promote_starved_batch(
                snapshot, self.starvation_threshold_s or 0.0, self.las_starvation_factor, cap
            )
        return _Cycle.decide(self, snapshot, next_promotion)


class _Cycle(Ordering):
    """One cycle: the layers (admission, preemption, reservations, ordering) and the per-job decision."""

    def __init__(self, pol: CalderaPolicy, snap: Snapshot, next_promotion: float = math.inf) -> None:
        super().__init__(pol, snap)
        self.next_promotion = next_promotion
        self._setup_running()
        self._setup_order()

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
        las_on = self.las_on
        thresholds = self.pol.las_thresholds_gpu_s or ()
        las_running = self.las_running
        bound = self.pol.max_preemptions_per_job
        not_best_effort: dict[tuple[str, str | None], int] = {}  # GPUs by (queue, model), added up at the end
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
            level = 0
            if las_on and job.las and not job.interactive and (bound is None or job.preemptions < bound):
                level = bisect_right(thresholds, job.attained_gpu_s)  # las_level, inlined: once per running job
                las_running.append((job, gpus, level))
                if rank > 0 and level:
                    self.las_avail += gpus
                elif level and self.pol.las_best_effort:
                    self.be_las_avail += gpus
            listed.append((job, rank, gpus, model, level))
            if rank == 0:
                self.be_avail += gpus
            else:
                key = (qn, model)
                not_best_effort[key] = not_best_effort.get(key, 0) + gpus
        for (qn, model), gpus in not_best_effort.items():
            nb = queues[qn].used_nb
            nb[GPU] = nb.get(GPU, 0.0) + gpus
            if model:
                mk = GPU + "/" + model
                nb[mk] = nb.get(mk, 0.0) + gpus
        self._contrib: dict[str, float] = {}
        self._update_reclaimable(self.queues)

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
        if q.has_caps:
            r = self._user_cap(job, q, need_g)
            if r is not None:
                return r
        # 2. queue capability
        exclude_models: frozenset[str] | None = None
        if q.cap:
            r, exclude_models = self._capability(q, model, cpu * n, float(mem * n), need_g)
            if r is not None:
                return r
        # 3. placement on free capacity, respecting reservations
        excluded, rmask = self._exclusion(job) if self.reservations else (None, 0)
        shape = (g, model, cpu, mem, n)
        fkey = (shape, rmask, exclude_models)
        if fkey not in self.nofit:
            speeds = job.speeds if self.pol.speed_placement else None
            plan = idx.place(g, model, cpu, mem, n, excluded, exclude_models, speeds)
            if plan is not None:
                self._start(job, q, rank, plan, g, cpu, mem, n, k)
                return None
            self.nofit.add(fkey)
        if rank == 0:
            if need_g and self.be_las_avail and job.las and not job.interactive:
                # least-attained-service among best-effort jobs only, never a higher class
                preempting = self._preempt(job, q, 0, k, g, model, cpu, mem, n, excluded, exclude_models, shape, rmask)
                if preempting is not None:
                    return preempting
            return self.nofit_reason(g, model, cpu, mem, n, excluded, exclude_models, True)
        # 4. soon-free capacity and preemption
        if need_g:
            preempting = self._preempt(job, q, rank, k, g, model, cpu, mem, n, excluded, exclude_models, shape, rmask)
            if preempting is not None:
                return preempting
        # 5. starvation: reservation
        if len(self.reservations) < self.pol.max_reservations and self.starving(job):
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
        r = self.nofit_reason(g, model, cpu, mem, n, excluded, exclude_models, False)
        return self.grace_reason(job, r) if self.lent_grace_until else r

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
            if cap is not None and used[GPU] >= cap - EPS:
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
