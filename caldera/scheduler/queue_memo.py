"""The queued jobs' per-job features as arrays, kept from one cycle to the next (``Snapshot.queue_memo``).

On a long queue each pass over the jobs' objects costs milliseconds whatever it reads (the memory of 100,000
objects, not the arithmetic), and a ``caldera`` cycle made several: about 40 of its 100 ms at 100,000 queued
jobs. With a memo, a cycle reads the objects of the jobs that were not queued in the previous cycle only; the
others' features are the previous cycle's arrays, less the jobs that cycle started.

The memo is state the caller keeps and passes in explicitly, as it keeps ``Snapshot.capacity``: the policy stays a
function of the snapshot. A caller that passes one keeps the contract the simulator keeps: the job objects of
``Snapshot.queued`` are kept from cycle to cycle (the jobs still queued in the same order, new ones after them), a
job's object is not changed while it stays queued, and each snapshot has a list of its own (the memo keeps it). A
job that starts, runs and is queued again may be the same object changed: the memo forgets the jobs its cycle
started. A queue that is not the previous one with the started jobs taken out and jobs added at its end is read
whole, so a wrong guess costs time, never a decision; objects are compared by identity first and by value
(dataclass equality) otherwise, so an equal copy counts as the same job. The live loop keeps a queued job's object
while its row is unchanged (caldera/server/snapshot_jobs.py) and passes one too.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import count
from operator import attrgetter

import numpy as np

from caldera.scheduler.job import SchedJob
from caldera.scheduler.ordering import gpus_per_replica, queued_since

GROUP_KEY = attrgetter("priority", "queue", "user")  # a queued job's group: (priority, queue, user)
_ATTAINED = attrgetter("attained_gpu_s")


@dataclass(frozen=True, slots=True)
class QueueChanges:
    """How a snapshot's ``queued`` differs from ``previous`` (the previous snapshot's list, the very object) besides
    the jobs the previous cycle started (the memo knows those) and the jobs added at its end: ``left``, the indices
    in ``previous`` of the jobs no longer in the queue (some of them started: either way); ``joined``, the indices
    in the new queue of the jobs put in between others. A job whose object was replaced in its place is in both."""

    previous: list[SchedJob]
    left: Sequence[int]
    joined: Sequence[int]


class QueueFeatures:
    """Arrays over one snapshot's ``queued`` (read-only): ``key`` (each job's group key as a number, into
    ``keys``), ``since`` (``queued_since``, or ``submitted_at`` for the jobs listed in ``unset``), ``per_replica``
    (GPUs per replica), ``attained`` (attained service in least-attained-service: 0 for interactive and opted-out
    jobs) and ``replicas`` (of the jobs with some attained service, 0 for the others); the last two None when not
    asked for."""

    __slots__ = ("key", "keys", "since", "unset", "per_replica", "attained", "replicas")

    def __init__(
        self,
        key: np.ndarray,
        keys: list[tuple],
        since: np.ndarray,
        unset: list[int],
        per_replica: np.ndarray,
        attained: np.ndarray | None,
        replicas: np.ndarray | None,
    ) -> None:
        self.key = key
        self.keys = keys
        self.since = since
        self.unset = unset
        self.per_replica = per_replica
        self.attained = attained
        self.replicas = replicas
        for a in (key, since, per_replica, attained, replicas):
            if a is not None:
                a.flags.writeable = False  # shared with the next cycle

    def groups(self) -> tuple[np.ndarray, list[tuple]]:
        """Each job's group numbered by first appearance in the queue, and the groups' keys in that order."""
        gi, order = number_by_first_appearance(self.key, len(self.keys))
        keys = self.keys
        return gi, [keys[k] for k in order.tolist()]

    def served(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Attained service per job, the jobs with some (ascending) and their replicas."""
        assert self.attained is not None and self.replicas is not None
        served = np.flatnonzero(self.attained)
        return self.attained, served, self.replicas[served]

    def _take(self, keep: np.ndarray) -> QueueFeatures:
        at = np.flatnonzero(keep)
        renumber = np.cumsum(keep) - 1
        unset = [int(renumber[i]) for i in self.unset if keep[i]]
        att, rep = self.attained, self.replicas
        return QueueFeatures(
            self.key[at],
            self.keys,
            self.since[at],
            unset,
            self.per_replica[at],
            None if att is None else att[at],
            None if rep is None else rep[at],
        )

    def _insert(self, at: np.ndarray, new: QueueFeatures) -> QueueFeatures:
        """These features with ``new``'s put in, so that they are at ``at`` (ascending) in the result."""
        before = at - np.arange(len(at), dtype=np.intp)  # np.insert's positions: in this array, not the result
        shift = np.searchsorted(before, self.unset, side="right") if self.unset else ()
        unset = sorted([i + int(k) for i, k in zip(self.unset, shift)] + [int(at[i]) for i in new.unset])
        att: np.ndarray | None = None
        rep: np.ndarray | None = None
        if self.attained is not None and new.attained is not None:
            assert self.replicas is not None and new.replicas is not None
            att = np.insert(self.attained, before, new.attained)
            rep = np.insert(self.replicas, before, new.replicas)
        return QueueFeatures(
            np.insert(self.key, before, new.key),
            new.keys,  # the later list: the same keys and new ones after them
            np.insert(self.since, before, new.since),
            unset,
            np.insert(self.per_replica, before, new.per_replica),
            att,
            rep,
        )

    def _then(self, tail: QueueFeatures) -> QueueFeatures:
        n = len(self.key)
        att: np.ndarray | None = None
        rep: np.ndarray | None = None
        if self.attained is not None and tail.attained is not None:
            assert self.replicas is not None and tail.replicas is not None
            att = np.concatenate((self.attained, tail.attained))
            rep = np.concatenate((self.replicas, tail.replicas))
        return QueueFeatures(
            np.concatenate((self.key, tail.key)),
            tail.keys,  # the later list: the same keys and new ones after them
            np.concatenate((self.since, tail.since)),
            self.unset + [n + i for i in tail.unset],
            np.concatenate((self.per_replica, tail.per_replica)),
            att,
            rep,
        )


class QueueMemo:
    """What the previous cycle read of its queue, and which of those jobs it started (see the module docstring).
    Create one, pass it in every snapshot (``Snapshot.queue_memo``) and keep the job objects. ``jobs_read`` counts
    the job objects it has read: a cycle that reads the queue whole adds the queue's length."""

    __slots__ = ("_seen", "_features", "_started", "_code", "_where", "jobs_read")

    def __init__(self) -> None:
        self._seen: list[SchedJob] = []
        self._features: QueueFeatures | None = None
        self._started: np.ndarray | None = None  # indices into _seen
        self._code: defaultdict[tuple, int] = defaultdict(count().__next__)  # group key -> number
        self._where: dict[str, int] = {}  # index in _seen of some jobs, by id (those others preempted for)
        self.jobs_read = 0

    def __copy__(self) -> QueueMemo:
        other = QueueMemo()
        other._seen = self._seen
        other._features = self._features
        other._started = self._started
        # a counter of its own: a copy of the defaultdict would share this one's, and number new groups past it
        other._code = defaultdict(count(len(self._code)).__next__, self._code)
        other._where = dict(self._where)
        other.jobs_read = self.jobs_read
        return other

    def read(self, queued: list[SchedJob], attained: bool, changes: QueueChanges | None = None) -> QueueFeatures:
        """The features of ``queued``, from the previous cycle's where they still hold; with ``attained``, also
        the attained service and replicas. ``changes``: how ``queued`` differs from the previous queue, besides
        the started jobs and the jobs at its end (used only when its ``previous`` is the list read last)."""
        f = self._reuse(queued, attained, changes)
        if f is None:
            f = self._read(queued, attained)
            self._where = {}
        self._seen = queued  # the caller's list: it makes a new one for every snapshot
        self._features = f
        self._started = None
        return f

    def after_cycle(self, started: np.ndarray, waiting: dict[str, int]) -> None:
        """What the cycle did with the queue just read: the jobs at ``started`` were started (their objects may
        change from now on); ``waiting``: the index of each job that victims were preempted for."""
        self._started = started
        self._where.update(waiting)

    def find(self, queued: list[SchedJob], ids: Iterable[str]) -> list[int] | None:
        """The indices in ``queued`` of the jobs ``ids``, in ascending order, where the memo knows them all (the
        jobs victims were preempted for, while they stay queued); None otherwise."""
        where = self._where
        found = []
        n = len(queued)
        for jid in ids:
            i = where.get(jid)
            if i is None or i >= n or queued[i].id != jid:
                return None
            found.append(i)
        return sorted(found)

    def note(self, where: dict[str, int]) -> None:
        """Indices of jobs in the queue just read, by id, as a full search found them (for :meth:`find`)."""
        self._where.update(where)

    def _reuse(self, queued: list[SchedJob], attained: bool, changes: QueueChanges | None) -> QueueFeatures | None:
        f, seen = self._features, self._seen
        if f is None or (attained and f.attained is None):
            return None
        if len(queued) == len(seen) and queued == seen:  # the same queue (the previous decisions not applied)
            return f
        said = changes if changes is not None and changes.previous is seen else None
        gone = np.zeros(len(seen), dtype=bool)
        if self._started is not None:
            gone[self._started] = True
        if said is not None and len(said.left):
            left = np.asarray(said.left, dtype=np.intp)
            if left.min() < 0 or left.max() >= len(seen):
                return None
            gone[left] = True
        keep = ~gone
        kept = len(seen) - int(np.count_nonzero(gone))
        joined = np.unique(np.asarray(said.joined if said is not None else (), dtype=np.intp))  # ascending
        before = joined - np.arange(len(joined), dtype=np.intp)  # where each goes among the jobs kept
        if len(joined) and (joined[0] < 0 or joined[-1] >= len(queued) or before[-1] > kept):
            return None
        # the previous queue less the jobs gone, with the joined ones put in: one pass of slices (each copy
        # touches every job's object once), skipping each gone job and putting each joined one before the kept
        # job it precedes
        into = np.append(np.flatnonzero(keep), len(seen))[before].tolist()
        steps = sorted([(i, 1, 0) for i in np.flatnonzero(gone).tolist()] + [(s, 0, k) for k, s in enumerate(into)])
        expected: list[SchedJob] = []
        at = 0
        for i, skip, k in steps:
            expected += seen[at:i]
            if skip:
                at = i + 1
            else:
                expected.append(queued[joined.item(k)])
                at = i
        expected += seen[at:]
        if kept < len(seen):
            f = f._take(keep)
            renumber = np.cumsum(keep) - 1
            self._where = {jid: int(renumber[i]) for jid, i in self._where.items() if keep[i]}
        if len(joined):
            f = f._insert(joined, self._read([queued[i] for i in joined.tolist()], attained))
            self._where = {jid: i + int(np.searchsorted(before, i, side="right")) for jid, i in self._where.items()}
        m = len(expected)
        tail = queued[m:]
        expected += tail
        # one pass that copies the list (each copy touches every job's object) and a comparison that does not
        if len(queued) < m or queued != expected:
            self._where = {}
            return None
        return f._then(self._read(tail, attained)) if tail else f

    def _read(self, jobs: list[SchedJob], attained: bool) -> QueueFeatures:
        n = len(jobs)
        self.jobs_read += n
        key = np.fromiter(map(self._code.__getitem__, map(GROUP_KEY, jobs)), dtype=np.intp, count=n)
        unset: list[int] = []
        since = queued_since(jobs, unset)
        att = rep = None
        if attained:
            att, rep = _attained(jobs)
        return QueueFeatures(key, list(self._code), since, unset, gpus_per_replica(jobs), att, rep)


def _attained(jobs: list[SchedJob]) -> tuple[np.ndarray, np.ndarray]:
    """Attained service of each job, 0 for jobs that take no part in least-attained-service (interactive, opted
    out); and the replicas of the jobs with some (0 for the others), read in the same visit."""
    att = np.fromiter(map(_ATTAINED, jobs), dtype=np.float64, count=len(jobs))
    served: list[int] = []
    counts: list[int] = []
    for i in np.flatnonzero(att).tolist():
        job = jobs[i]
        if job.las and not job.interactive:
            served.append(i)
            counts.append(job.replicas)
        else:
            att[i] = 0.0
    replicas = np.zeros(len(jobs), dtype=np.int64)
    replicas[served] = counts
    return att, replicas


def number_by_first_appearance(codes: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``codes`` (each below ``k``) renumbered 0, 1, ... by first appearance, and the codes present in that
    order."""
    n = len(codes)
    first = np.full(k, n, dtype=np.intp)
    np.minimum.at(first, codes, np.arange(n, dtype=np.intp))
    present = np.flatnonzero(first < n)
    order = present[np.argsort(first[present])]
    renumber = np.empty(k, dtype=np.intp)
    renumber[order] = np.arange(len(order), dtype=np.intp)
    return renumber[codes], order
