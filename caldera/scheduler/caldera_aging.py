"""Bounded waiting in the ``caldera`` policy: a queued job of a class below ``normal`` that has waited past its
patience is treated as ``normal`` for the rest of its wait (priority aging, as batch schedulers age priorities).

Strict classes alone let a steady stream of normal work keep low and best-effort jobs waiting without bound (on
Alibaba's trace, minutes-long best-effort pods waited weeks). Promoted, such a job is ordered with the normal jobs
and may preempt what a normal job may: best-effort jobs, and through least-attained-service batch jobs with more
attained service than itself. It never overtakes or preempts ``high`` jobs, and interactive jobs are never its
victims. It keeps the promotion while it runs (a running job that waited past its patience before it started):
left best-effort, the normal job it preempted would preempt it straight back, and so on (measured on Alibaba's
trace: 127,762 preemptions in 1,500 jobs).

Patience: ``max(aging_threshold_s, aging_factor x expected run time)``, so a job is promoted after a wait that is
long for its size, not merely long on a busy week.

The same bound for least-attained-service (:func:`promote_starved_batch`): a batch job preempted at a high level
would otherwise wait behind every job with less service, without bound for a large gang on a loaded cluster.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import fields, replace
from operator import attrgetter

import numpy as np

from caldera.core.tenancy import PriorityClass
from caldera.scheduler.engine import rank_of
from caldera.scheduler.snapshot import SchedJob, Snapshot

_NORMAL = rank_of(PriorityClass.NORMAL)


def patience_of(job: SchedJob, threshold_s: float, factor: float) -> float:
    return max(threshold_s, factor * (job.runtime_s or 0.0))


class QueuedPromotions:
    """The queued jobs a cycle treats as promoted, by index into ``Snapshot.queued``, found with array passes over
    the queue; a job is copied with its promotion only when the cycle looks at it (:meth:`job`). On a long queue
    tens of thousands of jobs are past their patience, and copying every one of them cost three times the rest of
    the cycle (100,000 queued jobs: 294 ms against 99 ms).

    ``normal``: raised to ``normal`` by aging (:func:`find_promotions`); ``lowest``: a starved batch job put back in
    the lowest attained-service level (:func:`promote_starved_batch`); ``next_at``: the earliest time another queued
    job will be promoted (``inf``: none)."""

    __slots__ = ("queued", "normal", "lowest", "next_at", "best_effort", "_flags", "_made")

    def __init__(
        self, queued: list[SchedJob], rank: np.ndarray, normal: np.ndarray, lowest: np.ndarray, next_at: float
    ) -> None:
        self.queued = queued
        self.normal = normal
        self.lowest = lowest
        self.next_at = next_at
        # ids of the best-effort jobs aging promoted, as the cycle looks at them: such a job takes best-effort jobs
        # only by least-attained-service, as they take each other
        self.best_effort: set[str] = set()
        flags = np.zeros(len(queued), dtype=np.uint8)
        flags[normal] = np.where(rank[normal] == 0, _TO_NORMAL | _WAS_BEST_EFFORT, _TO_NORMAL)
        flags[lowest] |= _TO_LOWEST
        self._flags = flags
        self._made: dict[int, SchedJob] = {}

    def job(self, i: int) -> SchedJob:
        """``queued[i]`` as this cycle sees it: a copy with its promotion (the same copy every time), else itself."""
        f = self._flags.item(i)
        if not f:
            return self.queued[i]
        made = self._made.get(i)
        if made is None:
            job = self.queued[i]
            changes: list[tuple[int, object]] = []
            if f & _TO_NORMAL:
                changes.append((_PRIORITY_AT, PriorityClass.NORMAL))
                if f & _WAS_BEST_EFFORT:
                    self.best_effort.add(job.id)
            if f & _TO_LOWEST:
                changes.append((_ATTAINED_AT, 0.0))
            made = self._made[i] = _changed(job, *changes)
        return made


_TO_NORMAL = 1
_TO_LOWEST = 2
_WAS_BEST_EFFORT = 4
_FIELD_NAMES = [f.name for f in fields(SchedJob)]
_FIELDS = attrgetter(*_FIELD_NAMES)  # every field, in the constructor's order
_PRIORITY_AT = _FIELD_NAMES.index("priority")
_ATTAINED_AT = _FIELD_NAMES.index("attained_gpu_s")
_LAS_AT = _FIELD_NAMES.index("las")
_NONE = np.zeros(0, dtype=np.intp)


def find_promotions(
    queued: list[SchedJob],
    now: float,
    rank: np.ndarray,
    since: np.ndarray,
    unset: list[int],
    per_replica: np.ndarray,
    aging: tuple[float, float] | None,
    starved: tuple[float, float, np.ndarray, np.ndarray, np.ndarray, float] | None,
) -> QueuedPromotions:
    """Which queued jobs are promoted now, from arrays over the queue: ``rank`` (each job's class rank), ``since``
    (its ``queued_since``, or ``submitted_at`` for the jobs at ``unset``), ``per_replica`` (GPUs per replica).
    ``aging``: (threshold, factor) of priority aging; ``starved``: (threshold, factor, each job's attained service
    in least-attained-service (0 for the others), the jobs with some, their replicas, the longest patience) of
    :func:`promote_starved_batch`; None: the rule is off. A job's object is read only where the arrays do not tell
    (a pass over the objects of 100,000 jobs costs milliseconds)."""
    next_at = math.inf
    normal = lowest = _NONE
    if aging is not None:
        threshold_s, factor = aging
        cand = np.flatnonzero(rank < _NORMAL)
        if len(cand):
            patience: np.ndarray | float
            if factor:
                rt = np.fromiter((queued[i].runtime_s or 0.0 for i in cand.tolist()), np.float64, len(cand))
                patience = np.maximum(threshold_s, factor * rt)
            else:
                patience = max(threshold_s, 0.0)
            normal, next_at = _due_now(cand, since[cand] + patience, now, next_at)
    if starved is not None:
        threshold_s, factor, attained, served, replicas, max_wait_s = starved
        gpus = per_replica[served] * replicas
        ok = gpus != 0
        if unset:
            ok &= ~np.isin(served, unset)
        cand, gpus = served[ok], gpus[ok]
        if len(cand):
            due = since[cand] + np.maximum(threshold_s, np.minimum(max_wait_s, factor * attained[cand] / gpus))
            lowest, next_at = _due_now(cand, due, now, next_at)
    return QueuedPromotions(queued, rank, normal, lowest, next_at)


def _changed(job: SchedJob, *changes: tuple[int, object]) -> SchedJob:
    """``dataclasses.replace`` for (field index, value) pairs, several times cheaper (it is called for hundreds of
    running jobs and many queued ones a cycle)."""
    values = list(_FIELDS(job))
    for at, value in changes:
        values[at] = value
    return SchedJob(*values)


def _due_now(cand: np.ndarray, due: np.ndarray, now: float, next_at: float) -> tuple[np.ndarray, float]:
    """The candidates whose ``due`` time has come, and the earliest of ``next_at`` and the due times to come."""
    later = due > now
    if later.any():
        next_at = min(next_at, float(due[later].min()))
    return cand[~later], next_at


def promote_waiting(snap: Snapshot, threshold_s: float, factor: float) -> Snapshot:
    """``snap`` with the running jobs that started after waiting past their patience raised to ``normal``: they
    keep the promotion while they run (the queued ones: :func:`find_promotions`)."""

    def normal(job: SchedJob) -> SchedJob:
        return _changed(job, (_PRIORITY_AT, PriorityClass.NORMAL))

    def due(job: SchedJob) -> float:
        return _due(job, threshold_s, factor)

    return _with(snap, _promote_running(snap, due, normal))


def _promote_running(
    snap: Snapshot, due: Callable[[SchedJob], float], change: Callable[[SchedJob], SchedJob]
) -> list[SchedJob] | None:
    """The running jobs with ``change`` made to those that started after their ``due`` time (None: none): they keep
    the promotion while they run."""
    running: list[SchedJob] | None = None
    for i, job in enumerate(snap.running):
        if job.started_at is not None and -math.inf < due(job) <= job.started_at:
            running = running or list(snap.running)
            running[i] = change(job)
    return running


def _with(snap: Snapshot, running: list[SchedJob] | None) -> Snapshot:
    return snap if running is None else replace(snap, running=running)


def _due(job: SchedJob, threshold_s: float, factor: float) -> float:
    """When the job was promoted; -inf for a job of ``normal`` or above."""
    if rank_of(job.priority) >= _NORMAL:
        return -math.inf
    return job.waiting_since + patience_of(job, threshold_s, factor)


def promote_starved_batch(
    snap: Snapshot, threshold_s: float, factor: float, max_wait_s: float = math.inf
) -> tuple[Snapshot, float]:
    """Bounded waiting under least-attained-service: a queued batch job preempted back into the queue that has
    waited ``factor`` times the wall time it ran (at least ``threshold_s``) goes back to the lowest level (its
    attained service counts as 0 in this cycle: first in the queue, and it may preempt any job above that level;
    found by :func:`find_promotions`), as Tiresias promotes a job that starved. Started that way, it is no
    least-attained-service victim while the rule, with the service it gains, still holds at its start: for
    ``1 / factor`` of the time it waited past its patience (else a large gang at a high level is the first victim
    of the next arrival, and waits again). Protecting it for its whole run was measured and is far worse:
    unpreemptible gangs held Philly's first 1,500 jobs on 20 x 8 at 66.7 h average JCT, against 28.3 h.
    ``max_wait_s`` caps the patience (``las_starvation_max_wait_s``): a job that ran for weeks is not kept waiting
    three times that; started after waiting past the cap, it stays protected (the rule holds whatever it gains).
    Returns the snapshot with those running jobs protected, and the earliest time a protection ends."""

    def due(job: SchedJob) -> float:
        return _starved_at(job, threshold_s, factor, max_wait_s)

    next_at = math.inf
    protected: list[SchedJob] = []

    def protect(job: SchedJob) -> SchedJob:  # no least-attained-service victim
        protected.append(job)
        return _changed(job, (_LAS_AT, False))

    running = _promote_running(snap, due, protect)
    for job in protected:  # until the service it gains takes its start past its patience
        assert job.started_at is not None and job.queued_since is not None
        waited = job.started_at - job.queued_since
        if waited >= max_wait_s:
            continue  # waited past the cap: protected to its end
        ends = snap.now + waited / factor - job.attained_gpu_s / job.gpus
        if ends > snap.now:
            next_at = min(next_at, ends)
    return _with(snap, running), next_at


def _starved_at(job: SchedJob, threshold_s: float, factor: float, max_wait_s: float = math.inf) -> float:
    """When a job that ran before and went back to the queue counts as starved; -inf for the others."""
    gpus = job.gpus
    if not job.las or job.interactive or not gpus or not job.attained_gpu_s or job.queued_since is None:
        return -math.inf
    return job.queued_since + max(threshold_s, min(max_wait_s, factor * job.attained_gpu_s / gpus))
