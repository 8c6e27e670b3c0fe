"""Ordering in the ``caldera`` policy: jobs of queues below their GPU guarantee, then priority class, starving jobs,
fair share, first come; and when time alone could change what a cycle decides (``Decisions.wake_at``).
"""

from __future__ import annotations

import math

import numpy as np

from caldera.core.resources import GPU
from caldera.core.tenancy import PriorityClass
from caldera.scheduler.caldera_admission import patience_s
from caldera.scheduler.caldera_aging import find_promotions
from caldera.scheduler.caldera_options import EPS
from caldera.scheduler.caldera_reservations import Reservations
from caldera.scheduler.engine import rank_of
from caldera.scheduler.fairshare import FairShare
from caldera.scheduler.ordering import sort_order
from caldera.scheduler.queue_memo import QueueMemo, number_by_first_appearance
from caldera.scheduler.reasons import WAITING_FOR_PREEMPTION
from caldera.scheduler.snapshot import Decisions, SchedJob


class Ordering(Reservations):
    def _setup_order(self) -> None:
        snap = self.snap
        queued = snap.queued
        n = len(queued)
        levels = len(self.pol.las_thresholds_gpu_s or ()) + 1
        starved_on = self.pol.las_starvation_factor is not None and self.pol.las_thresholds_gpu_s is not None
        memo = snap.queue_memo
        self.memo = memo
        features = (memo if memo is not None else QueueMemo()).read(
            queued, levels > 1 or starved_on, snap.queue_changes
        )
        gi, groups = features.groups()  # group = (priority, queue, user)
        unset = features.unset  # jobs without queued_since
        qs = features.since
        per_replica = features.per_replica
        att = served = replicas = None
        if (levels > 1 or starved_on) and n:
            att, served, replicas = features.served()
        if n and (self.pol.aging_threshold_s is not None or starved_on):
            gi, groups, att, served = self._promote(gi, groups, qs, unset, att, served, replicas, per_replica)
        if levels == 1:
            att = served = None
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
        # major key, per job: (owed, class), then its attained-service level, then (not starving, fair share)
        tier = [(o, 3 - r) for o, r in zip(owed, grank)]
        tdense = {k: i for i, k in enumerate(sorted(set(tier)))}
        rest_ns = [(1, s) for s in scores]
        rest_st = [(0, 0.0) if r > 0 else key for r, key in zip(grank, rest_ns)]
        rdense = {k: i for i, k in enumerate(sorted(set(rest_ns) | set(rest_st)))}
        t_of = np.array([tdense[k] for k in tier], dtype=np.int64)
        r_ns = np.array([rdense[k] for k in rest_ns], dtype=np.int64)
        r_st = np.array([rdense[k] for k in rest_st], dtype=np.int64)
        if att is None:
            lev = np.zeros(n, dtype=np.int64)
        else:
            th = np.asarray(self.pol.las_thresholds_gpu_s, dtype=np.float64)
            lev = np.searchsorted(th, att, side="right").astype(np.int64)
        nr = len(rdense)
        maj = (t_of[gi] * levels + lev) * nr + r_ns[gi] if n else np.zeros(0, dtype=np.int64)
        starving = None
        if self.thr is not None and n and self.pol.max_reservations > 0:
            rt = np.fromiter((j.runtime_s or 0.0 for j in queued), dtype=np.float64, count=n)
            waited = self.now - qs
            starving = (waited >= patience_s(self.thr, self.pol.starvation_factor, rt)) & (
                np.asarray(grank, dtype=np.int64)[gi] > 0
            )
            if starving.any():
                maj = np.where(starving, self._starving_key(t_of[gi], levels, nr, r_ns[gi], r_st[gi]), maj)
            else:
                starving = None
        if self.pol.within_level == "attained" and att is not None and served is not None and len(served):
            oia = _attained_order(queued, qs, maj, nr, att, served)
        else:
            oia = sort_order(queued, qs, maj)
        self.oia = oia
        if starving is not None:
            self.must_see = starving[oia]  # starving jobs are looked at until the reservations run out
        self.k_sorted = gi[oia]
        self.g_sorted = per_replica[oia]
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
        for k, (_, qn, u) in enumerate(groups):
            q = self.gq[k]
            cap = q.cap.get(GPU)
            if cap is not None and q.used.get(GPU, 0.0) >= cap - EPS:
                self.block(k, self._capability_reason(q, GPU, q.used.get(GPU, 0.0), cap, 0), True)
            if q.has_caps:
                us = self.users.get((qn, u))
                if us is not None:
                    if q.max_run is not None and us[2] >= q.max_run:
                        self.block(k, self._user_reason("max_running_jobs", q.max_run, us[2], q, u), False)
                    elif q.max_gpus is not None and us[0] >= q.max_gpus:
                        self.block(k, self._user_reason("max_gpus", q.max_gpus, us[0], q, u), True)
        self._refresh_pre()

    def _promote(
        self,
        gi: np.ndarray,
        groups: list[tuple],
        since: np.ndarray,
        unset: list[int],
        att: np.ndarray | None,
        served: np.ndarray | None,
        replicas: np.ndarray | None,
        per_replica: np.ndarray,
    ) -> tuple[np.ndarray, list[tuple], np.ndarray | None, np.ndarray | None]:
        """The queued jobs' promotions (:mod:`caldera_aging`): groups ``gi`` / ``groups`` and attained service
        ``att`` (``served``: the jobs with some) as the promoted jobs would give them, numbered as the promoted
        queue would be (by first appearance); the loop gets each promoted job as a copy with its promotion
        (``job_at``)."""
        pol = self.pol
        rank = np.array([rank_of(pv) for pv, _, _ in groups], dtype=np.int64)[gi]
        aging = None if pol.aging_threshold_s is None else (pol.aging_threshold_s, pol.aging_factor)
        starved = None
        if pol.las_starvation_factor is not None and pol.las_thresholds_gpu_s is not None and att is not None:
            assert served is not None and replicas is not None
            cap = math.inf if pol.las_starvation_max_wait_s is None else pol.las_starvation_max_wait_s
            starved = (pol.starvation_threshold_s or 0.0, pol.las_starvation_factor, att, served, replicas, cap)
        promo = find_promotions(self.snap.queued, self.now, rank, since, unset, per_replica, aging, starved)
        self.next_promotion = min(self.next_promotion, promo.next_at)
        if len(promo.normal) == 0 and len(promo.lowest) == 0:
            return gi, groups, att, served
        self.job_at = promo.job
        if len(promo.lowest):
            assert att is not None and served is not None  # lowest is empty without them
            att = att.copy()
            att[promo.lowest] = 0.0
            served = served[att[served] != 0]
        if len(promo.normal) == 0:
            return gi, groups, att, served
        self.promoted_be = promo.best_effort
        if pol.las_best_effort:
            self.queued_be = promo.best_effort
        return (*_regroup(gi, groups, promo.normal), att, served)

    def decisions(self, extra: dict | None = None, extra_text: str = "", extra_from: int = 1) -> Decisions:
        if self.memo is not None:  # the started jobs' objects may change before they are queued again
            started = self.oia[np.asarray(self.started_idx, dtype=np.intp)]
            waiting = {}
            if self.preemptions:  # where the jobs victims were preempted for are, for the next cycle's search
                for p, r in self.explicit:
                    if getattr(r, "code", None) == WAITING_FOR_PREEMPTION:
                        i = self.oia.item(p)
                        waiting[self.queued[i].id] = i
            self.memo.after_cycle(started, waiting)
        return super().decisions(extra, extra_text, extra_from)

    def wake_at(self) -> float | None:
        w = super().wake_at()
        if w is not None and self.next_promotion < w:
            return self.next_promotion  # a promotion may let a job start or preempt
        return w

    def _starving_key(self, tier, levels: int, nr: int, r_ns, r_st):
        """With least-attained-service, a starving job is promoted to the lowest level and takes its turn there by
        fair share (as Tiresias promotes jobs that waited too long): put first, old jobs with much service would
        undo what LAS gains. Without, starving jobs go first in their tier."""
        if levels > 1:
            return tier * levels * nr + r_ns
        return tier * levels * nr + r_st

    def best_effort_group(self, group: int) -> bool:
        return self.grank[group] == 0

    def timed_wake(self) -> float | None:
        cap = self.pol.max_preemptions_per_cycle
        if self.las_on and (self.gave_up or (cap is not None and len(self.preemptions) >= cap)):
            return None  # preemption search stopped early: the next cycle may go on where this one stopped
        w = self._timed_wake()
        return None if w is None else min(w, self._las_wake(), self.grace_wake)

    def _las_wake(self) -> float:
        """Running batch jobs climb the attained-service levels, and become preemptible once they have run
        ``las_min_run_s``: the next such moment, while some waiting batch job could use it."""
        if not self.las_on or not any(j.las and not j.interactive for j in self.snap.queued):
            return math.inf
        th = self.pol.las_thresholds_gpu_s or ()
        min_run = self.pol.las_min_run_s
        t = math.inf
        now = self.now
        nth = len(th)
        for job, g, L in self.las_running:
            if nth > L:
                t = min(t, now + (th[L] - job.attained_gpu_s) / g)
            if L and job.started_at is not None and job.started_at + min_run > now:
                t = min(t, job.started_at + min_run)
        for job in self.started_jobs:
            g = job.request.gpu * job.replicas
            if not g or job.terminating or not job.las or job.interactive:
                continue
            L = self.las_level(job.attained_gpu_s)
            if nth > L:
                t = min(t, now + (th[L] - job.attained_gpu_s) / g)
            if L:
                # a resumed job already above the lowest level: a victim for the waiting jobs below it from its
                # minimum run on, although this cycle saw it queued (its started_at is its previous attempt's)
                t = min(t, now + min_run)
        return t

    def _timed_wake(self) -> float | None:
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


def _attained_order(
    queued: list[SchedJob], qs: np.ndarray, maj: np.ndarray, nr: int, att: np.ndarray, served: np.ndarray
) -> np.ndarray:
    """By tier and level, then least attained service ``att``, then fair share (``maj`` is ``(tier, level) * nr +
    fair-share rank``), then first queued, then id. ``served``: the jobs with some attained service (the others
    have 0, which comes first unless some job has less)."""
    values, inverse = np.unique(att[served], return_inverse=True)
    if len(values) and values[0] < 0:
        values, att_rank = np.unique(att, return_inverse=True)
        v = len(values)
    else:
        att_rank = np.zeros(len(att), dtype=np.int64)
        att_rank[served] = inverse + 1
        v = len(values) + 1
    return sort_order(queued, qs, ((maj // nr) * v + att_rank) * nr + maj % nr)


def _regroup(gi: np.ndarray, groups: list[tuple], normal: np.ndarray) -> tuple[np.ndarray, list[tuple]]:
    """Groups (priority, queue, user) with the jobs at ``normal`` raised to the normal class, numbered by first
    appearance in the queue as the groups of the promoted queue would be."""
    keys = list(groups)
    index = {key: k for k, key in enumerate(keys)}
    to = []
    for _, qn, u in groups:
        key = (PriorityClass.NORMAL, qn, u)
        k = index.get(key)
        if k is None:
            k = index[key] = len(keys)
            keys.append(key)
        to.append(k)
    moved = gi.copy()
    moved[normal] = np.asarray(to, dtype=np.intp)[gi[normal]]
    numbered, order = number_by_first_appearance(moved, len(keys))
    return numbered, [keys[k] for k in order.tolist()]
