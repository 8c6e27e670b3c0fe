"""The live loop's jobs as the policy sees them, kept from one cycle to the next.

Every cycle offers the policy every queued job. Building each one from the database every cycle (an ORM object per
row, its JSON spec and stored reasons parsed, ``Resources`` validated, then a fresh ``SchedJob``) cost far more than
the policy on a long queue, and a fresh object per cycle kept the policy's queue memo (``Snapshot.queue_memo``)
from working. So the loop keeps, in one ``SnapshotJobs``:

* what each job's spec tells the scheduler (``SpecFacts``), read once: a spec is fixed at submission;
* each queued job's ``SchedJob`` with the row values it was built from: a row whose values changed (re-queued,
  more attained service, its user's learned run time moved...) gets a new object, which the memo sees as new;
* the stored pending reasons, parsed once per text (shared: most queued jobs store ``[]``, their places being
  kept in memory, queue_positions.py);
* what a cycle derives from those: the queue in the order of submission, the jobs that holds, dependencies or array
  limits may withhold, those whose stored reasons are not empty, those that can share a GPU, the declared workloads
  and the (user, kind) keys of the learned run times. A cycle changes them for the rows it read changed and for
  the jobs of the users whose learned run time or name moved, not for the whole queue: on a long queue one pass
  in Python over every job cost more than the rest of the cycle. Which jobs are withheld is decided again every
  cycle, from the few that may be;
* how the queue offered differs from the previous cycle's (jobs taken out of its middle or put back in), for the
  policy's queue memo (``Snapshot.queue_changes``), which then reads those jobs instead of the whole queue.

A cycle reads only the job rows written since the last cycle (``jobs.change_seq``, set by triggers on every
write of a row: migration 0022) and the jobs deleted since (``job_deletions``), and keeps the queued rows'
plain columns (and the reasons' text); the specs of jobs not seen before; and ORM objects only for the jobs that
holds, dependencies or array limits may withhold, and for the active jobs (few). Every ``FULL_READ_EVERY_S`` (and at
the first cycle) it reads every queued row instead, and counts in ``missed`` the rows the changes read had missed
(none, unless a write escaped the triggers), logged as a warning. On PostgreSQL ``change_seq`` is the writing
transaction's id, not a counter (whose lock would deadlock writers of jobs: migration 0022 says how), and a read
takes the rows from its last read's snapshot xmin up, some of them again.
What it builds is what a fresh build gives, value for value (``tests/test_loop_snapshot_cache.py``).
"""

from __future__ import annotations

import json
import logging
from bisect import bisect_left
from collections import namedtuple
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Text, cast, delete, select, text
from sqlalchemy.orm import Session

from caldera.core.kinds import is_interactive
from caldera.core.resources import Resources
from caldera.core.states import JobState
from caldera.core.tenancy import PriorityClass
from caldera.db.models import Job, JobChangeCounter, JobDeletion
from caldera.scheduler.queue_memo import QueueChanges, QueueMemo
from caldera.scheduler.sharing import can_share
from caldera.scheduler.snapshot import SchedJob
from caldera.server import holds

log = logging.getLogger(__name__)

QUEUED = JobState.QUEUED.value
FULL_READ_EVERY_S = 300.0  # every queued row read again, as a check of the changes read in between
_REORDER_IN_PLACE = 64  # at most this many jobs in or out (or a 32nd of the queue) change the kept order in place
_CHUNK = 500  # ids per IN (...): under every database's limit on bound parameters
# what a queued job's SchedJob is built from, besides its spec and user name: a change in any gives a new object
_BUILT_FROM = (
    Job.user_id,
    Job.account,
    Job.queue,
    Job.kind,
    Job.priority,
    Job.submitted_at,
    Job.queued_at,
    Job.attained_gpu_s,
    Job.attempt,
)
_QUEUED_ROW = (
    Job.id,
    *_BUILT_FROM,
    Job.array_id,
    cast(Job.hold, Text).label("hold"),
    cast(Job.pending_reasons, Text).label("reasons"),
)
_SUBMITTED = 1 + [c.key for c in _BUILT_FROM].index("submitted_at")
_ARRAY_ID, _HOLD, _REASONS = len(_BUILT_FROM) + 1, len(_BUILT_FROM) + 2, len(_BUILT_FROM) + 3
_QueuedRow = namedtuple("_QueuedRow", [c.key for c in _QUEUED_ROW])  # type: ignore[misc]


@dataclass(frozen=True, slots=True)
class SpecFacts:
    """What a job's spec tells the scheduler."""

    request: Resources
    replicas: int
    max_runtime_s: float | None
    preemptible: bool
    shareable: bool
    decay_tolerance: float | None
    workload: str | None
    has_dependencies: bool

    @classmethod
    def of(cls, spec: dict[str, Any]) -> SpecFacts:
        return cls(
            request=Resources(**spec.get("resources", {})),
            replicas=int(spec.get("replicas", 1)),
            max_runtime_s=spec.get("max_runtime_s"),
            preemptible=spec.get("preemptible", True),
            shareable=bool(spec.get("shareable", False)),
            decay_tolerance=spec.get("decay_tolerance"),
            workload=spec.get("workload"),
            has_dependencies=bool(spec.get("after")),
        )


def sched_job(job: Any, facts: SpecFacts, user: str, learned: float | None, queued: bool) -> SchedJob:
    """A job as the policy sees it, from its row (a ``Job`` or a row of ``_QUEUED_ROW``); the running fields
    (started_at, allocations, ...) are the caller's."""
    interactive = is_interactive(job.kind)
    sj = SchedJob(
        id=job.id,
        user=user,
        account=job.account,
        queue=job.queue,
        priority=PriorityClass(job.priority),
        request=facts.request,
        replicas=facts.replicas,
        submitted_at=job.submitted_at,
        queued_since=job.queued_at,
        interactive=interactive,
        max_runtime_s=facts.max_runtime_s,
        attained_gpu_s=job.attained_gpu_s,
        las=not interactive and facts.preemptible,
        shareable=facts.shareable,
        decay_tolerance=facts.decay_tolerance,
        expected_runtime_s=learned,
        # every earlier attempt of a live job ended in a re-queue (preempted, evicted, its node drained)
        preemptions=job.attempt if queued else max(0, job.attempt - 1),
    )
    if sj.expected_runtime_s is not None and queued and sj.attained_gpu_s:
        # a re-queued job has done part of its work: what is left of the estimate (at least a minute)
        sj.expected_runtime_s = max(60.0, sj.expected_runtime_s - sj.attained_gpu_s / max(sj.gpus, 1))
    return sj


@dataclass(slots=True)
class QueuedCycle:
    """One cycle's queued jobs: those offered to the policy (in the order of submission), the stored reasons of
    the queued ones as last read (held and waiting ones too: the policy gives no reasons for those), and the ORM
    objects read (kept referenced for the cycle, so that ``Session.get`` finds them)."""

    offered: list[SchedJob]
    stored_reasons: dict[str, list]
    loaded: list[Job]
    withheld: set[str]  # the queued jobs not offered
    stored_some: set[str]  # the queued jobs whose stored reasons are not empty
    sharers: list[SchedJob]  # the offered jobs that can share a GPU, in the order of ``offered``
    changes: QueueChanges | None  # how ``offered`` differs from the previous cycle's (``Snapshot.queue_changes``)


class SnapshotJobs:
    """The live loop's memory of its queued jobs between cycles (see the module docstring)."""

    def __init__(self) -> None:
        self.specs: dict[str, SpecFacts] = {}
        # stored pending reasons by their text, parsed once: most jobs of a long queue store the same few texts
        self._parsed_reasons: dict[str | None, list] = {}
        self.memo = QueueMemo()
        # the queued rows by job id, each with its change_seq
        self._rows: dict[str, tuple[tuple, int]] = {}
        # the rows and deletions whose change_seq is below this were all read (None: read every queued row next)
        self._next: int | None = None
        self._full_read_at = 0.0
        self.missed = 0  # rows the full reads found that the changes read had missed
        # What is built from the rows, kept between cycles and changed only for the jobs in _changed (their rows
        # read changed, new or gone since the last build) and the jobs of users whose name or learned run time
        # moved: a cycle's passes over every queued job in Python were most of a long queue's cycle.
        self._changed: set[str] = set()
        self._built: dict[str, tuple[tuple, SchedJob]] = {}  # job id -> (what its SchedJob is built from, it)
        self._order: list[tuple[float, str]] = []  # (submitted_at, id) of every queued job, sorted
        self._jobs: list[SchedJob] = []  # their SchedJobs, in that order
        self._by_key: dict[tuple[int, str], set[str]] = {}  # (user id, kind) -> its queued jobs
        self._names: dict[int, str] = {}  # the user names and learned run times the kept jobs were built with
        self._learned: dict[tuple[int, str], float] = {}
        self._maybe_withheld: set[str] = set()  # held, in an array or with dependencies: checked every cycle
        self.stored: dict[str, list] = {}  # each queued job's stored reasons, parsed
        self._stored_some: set[str] = set()  # the jobs whose stored reasons are not empty: few
        self._sharers: set[str] = set()  # the jobs that can share a GPU
        self.workloads: dict[str, str] = {}  # the queued jobs' declared workloads (those that declare one)
        # the previous cycle's offered list and the places (submitted at, id) of the jobs withheld from it
        self._previous: tuple[list[SchedJob], list[tuple[float, str]]] | None = None

    @staticmethod
    def _mark(conn: Any) -> int:
        """Taken before a read: every row or deletion whose change_seq is below it is committed and so read by it.
        SQLite: the counter's values are taken in the order of commit (migration 0022). PostgreSQL: change_seq is
        the writing transaction's id, and one at or above the snapshot's xmin may still be running."""
        if conn.dialect.name == "sqlite":
            return conn.execute(select(JobChangeCounter.value)).scalar_one() + 1
        return conn.execute(text("SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint")).scalar_one()

    def _read_changes(self, db: Session) -> None:
        """The rows written and the jobs deleted since the last read (at worst some read again)."""
        conn = db.connection()
        mark = self._mark(conn)
        query = select(*_QUEUED_ROW, Job.state, Job.change_seq).where(Job.change_seq >= self._next)
        changed = conn.execute(query).all()
        deleted = conn.execute(select(JobDeletion.job_id).where(JobDeletion.seq >= self._next)).scalars()
        self._next = mark
        for *row, state, seq in changed:
            self._changed.add(row[0])
            if state == QUEUED:
                self._rows[row[0]] = (tuple(row), seq)
            else:
                self._rows.pop(row[0], None)
        for job_id in deleted:
            if self._rows.pop(job_id, None) is not None:
                self._changed.add(job_id)

    def _read_all(self, db: Session, now: float) -> None:
        """Every queued row, and a check of what the changes read had kept (from the first cycle on, none)."""
        conn = db.connection()
        mark = self._mark(conn)  # first: what is read after it is as new or newer, and read again next time at worst
        query = select(*_QUEUED_ROW, Job.change_seq).where(Job.state == QUEUED)
        rows = {row[0]: (tuple(row[:-1]), row[-1]) for row in conn.execute(query)}  # Core: no ORM per row
        if self._next is not None:
            self._check(conn, rows, self._next)
            # the deletions this loop has read: no later read needs them (a loop's first read prunes none, and a
            # fresh build's, as tests and benchmarks make, none that the loop has not read)
            conn.execute(delete(JobDeletion).where(JobDeletion.seq < self._next))
        kept = self._rows
        # what is rebuilt: the rows that differ from those kept (after a rolled-back cycle, its undone writes too)
        self._changed.update(jid for jid, had in rows.items() if kept.get(jid) != had)
        self._changed.update(kept.keys() - rows.keys())
        self._rows = rows
        self._next, self._full_read_at = mark, now

    def _check(self, conn: Any, rows: dict[str, tuple[tuple, int]], next_: int) -> None:
        """Count the rows the changes read missed: a queued row it should have read (written before its last read)
        that it holds otherwise or not at all, or one it holds that is no longer queued with no write since."""
        kept = self._rows
        wrong = [jid for jid, (row, seq) in rows.items() if seq < next_ and kept.get(jid, (None,))[0] != row]
        gone = kept.keys() - rows.keys()
        if gone:
            gone -= set(conn.execute(select(Job.id).where(Job.change_seq >= next_)).scalars())
            gone -= set(conn.execute(select(JobDeletion.job_id).where(JobDeletion.seq >= next_)).scalars())
        if wrong or gone:
            self.missed += len(wrong) + len(gone)
            log.warning("the changed jobs read missed %d rows, e.g. %s", len(wrong) + len(gone), (wrong or [*gone])[0])

    def facts(self, job: Job) -> SpecFacts:
        """An ORM job's spec facts, read once."""
        facts = self.specs.get(job.id)
        if facts is None:
            facts = self.specs[job.id] = SpecFacts.of(job.spec)
        return facts

    def forget_reads(self) -> None:
        """Read every queued row at the next cycle: this cycle's transaction is rolled back, and the changes it
        read may include its own writes, undone (on SQLite their counter values are then taken again)."""
        self._next = None

    def read(self, db: Session, now: float) -> None:
        """Read the queued rows written since the last read (all of them at the first cycle and every
        ``FULL_READ_EVERY_S``), and the specs of the jobs not seen before."""
        if self._next is None or now - self._full_read_at >= FULL_READ_EVERY_S:
            self._read_all(db, now)
        else:
            self._read_changes(db)
        rows, specs = self._rows, self.specs
        missing = sorted(
            (jid for jid in self._changed if jid not in specs and jid in rows),
            key=lambda jid: (rows[jid][0][_SUBMITTED], jid),
        )
        for at in range(0, len(missing), _CHUNK):
            chunk = missing[at : at + _CHUNK]
            got = {jid: spec for jid, spec in db.execute(select(Job.id, Job.spec).where(Job.id.in_(chunk)))}
            for jid in chunk:  # made in the queue's order, as the SchedJobs are (see _rebuild)
                specs[jid] = SpecFacts.of(got[jid])

    def rows(self) -> list[tuple]:
        """The queued rows as last read (``_QUEUED_ROW``: id, user id, account, queue, kind, ...), in the order of
        submission."""
        return sorted((row for row, _ in self._rows.values()), key=lambda row: (row[_SUBMITTED], row[0]))

    def learned_keys(self) -> set[tuple[int, str]]:
        """The (user id, kind) of every queued job as last read (and perhaps of some no longer queued)."""
        rows = self._rows
        new = {(kept[0][1], kept[0][4]) for kept in map(rows.get, self._changed) if kept is not None}
        return new.union(self._by_key)

    def queued(
        self, db: Session, names: dict[int, str], learned: dict[tuple[int, str], float], now: float
    ) -> QueuedCycle:
        """The queued jobs the policy is offered: held jobs and those waiting for a dependency or their array's
        limit are not (``holds.withhold`` writes their reasons)."""
        removed, added, replaced = self._rebuild(names, learned)
        maybe_withheld = sorted(self._maybe_withheld)
        loaded: list[Job] = []
        for at in range(0, len(maybe_withheld), _CHUNK):
            loaded += db.scalars(select(Job).where(Job.id.in_(maybe_withheld[at : at + _CHUNK])))
        loaded.sort(key=lambda j: (j.submitted_at, j.id))
        withheld = holds.withhold(db, loaded, now)
        order, jobs, built = self._order, self._jobs, self._built
        held = sorted((built[jid][0][0][_SUBMITTED], jid) for jid in withheld if jid in built)
        if not held:
            offered = list(jobs)  # a list of its own: the memo keeps it
        else:
            at = [bisect_left(order, k) for k in held]
            offered = []
            for start, end in zip([0] + [i + 1 for i in at], [*at, len(jobs)]):
                offered += jobs[start:end]
        specs, rows = self.specs, self._rows
        if len(specs) > 2 * len(rows) + 1000:  # forget the specs of jobs long gone, now and then
            self.specs = {jid: f for jid, f in specs.items() if jid in rows}
        sharers = [self._built[jid][1] for jid in self._sharers - withheld]
        sharers.sort(key=lambda sj: (sj.submitted_at, sj.id))
        changes = self._changes(removed, added, replaced, held)
        self._previous = (offered, held)
        return QueuedCycle(offered, self.stored, loaded, withheld, self._stored_some, sharers, changes)

    def _changes(
        self,
        removed: list[tuple[float, str]],
        added: list[tuple[float, str]],
        replaced: list[tuple[float, str]],
        held: list[tuple[float, str]],
    ) -> QueueChanges | None:
        """How this cycle's offered list differs from the previous cycle's, besides jobs at its end: the jobs
        taken out of the order (gone or re-queued), given a new object in their place, or withheld now, and those
        put into it (new or re-queued) or no longer withheld; by their places in the orders less the jobs withheld
        from each. Found by bisection in this cycle's order, the previous one being it less the places added plus
        those removed: no pass over the queue, no copy of it."""
        if self._previous is None:
            return None
        offered, held_before = self._previous
        order = self._order
        removed.sort()
        added.sort()
        gone, new, was, now = set(removed), set(added), set(held_before), set(held)

        def in_order(k: tuple[float, str]) -> int | None:
            i = bisect_left(order, k)
            return i if i < len(order) and order[i] == k else None

        left = []
        for k in gone | set(replaced) | (now - was):
            if k not in was and (k in gone or k not in new and in_order(k) is not None):
                before = bisect_left(order, k) - bisect_left(added, k) + bisect_left(removed, k)
                left.append(before - bisect_left(held_before, k))
        joined = []
        for k in new | set(replaced) | (was - now):
            i = in_order(k)
            if k not in now and i is not None:
                joined.append(i - bisect_left(held, k))
        return QueueChanges(offered, sorted(left), sorted(joined))

    def _rebuild(
        self, names: dict[int, str], learned: dict[tuple[int, str], float]
    ) -> tuple[list[tuple[float, str]], list[tuple[float, str]], list[tuple[float, str]]]:
        """Bring what is built from the rows up to date, for the jobs whose rows or users' learned run times or
        names changed; the others keep their objects. Returns the places (submitted at, id) taken out of the
        order, those put in and those whose job has a new object."""
        changed, self._changed = self._changed, set()
        by_key = self._by_key
        if names != self._names:
            moved = {u for u in names.keys() | self._names.keys() if names.get(u) != self._names.get(u)}
            for key, jids in by_key.items():
                if key[0] in moved:
                    changed |= jids
        old_learned = self._learned
        for key, jids in by_key.items():
            if learned.get(key) != old_learned.get(key):
                changed |= jids
        self._names, self._learned = dict(names), dict(learned)
        if len(self._parsed_reasons) > len(self._rows) + 1000:  # texts no row holds any more
            self._parsed_reasons.clear()
        built, rows, specs, parsed = self._built, self._rows, self.specs, self._parsed_reasons
        removed: list[tuple[float, str]] = []
        added: list[tuple[tuple[float, str], SchedJob]] = []
        replaced: list[tuple[tuple[float, str], SchedJob]] = []
        # in the queue's order: objects made one after the other lie near each other in memory, and the policy's
        # passes over a long queue (in that order) run at half the speed over objects made in any other
        for jid in sorted(changed, key=lambda jid: (rows[jid][0][_SUBMITTED], jid) if jid in rows else (0.0, jid)):
            had = built.pop(jid, None)
            if had is not None:
                key = (had[0][0][1], had[0][0][4])
                jids = by_key[key]
                jids.discard(jid)
                if not jids:
                    del by_key[key]
                self._maybe_withheld.discard(jid)
                self._stored_some.discard(jid)
                self._sharers.discard(jid)
                self.stored.pop(jid, None)
                self.workloads.pop(jid, None)
            kept = rows.get(jid)
            if kept is None:
                if had is not None:
                    removed.append((had[0][0][_SUBMITTED], jid))
                continue
            row = kept[0]
            user_id, kind = row[1], row[4]
            user = names.get(user_id, "?")
            runtime = learned.get((user_id, kind))
            built_from = (row[:_ARRAY_ID], user, runtime)
            if had is not None and had[0] == built_from:
                sj = had[1]
            else:
                sj = sched_job(_QueuedRow._make(row), specs[jid], user, runtime, queued=True)
            built[jid] = (built_from, sj)
            at = (row[_SUBMITTED], jid)
            if had is None:
                added.append((at, sj))
            elif had[0][0][_SUBMITTED] != row[_SUBMITTED]:
                removed.append((had[0][0][_SUBMITTED], jid))
                added.append((at, sj))
            elif had[1] is not sj:
                replaced.append((at, sj))
            by_key.setdefault((user_id, kind), set()).add(jid)
            facts = specs[jid]
            if row[_HOLD] not in (None, "null") or row[_ARRAY_ID] is not None or facts.has_dependencies:
                self._maybe_withheld.add(jid)
            text = row[_REASONS]
            reasons = parsed.get(text)
            if reasons is None:
                reasons = parsed[text] = (json.loads(text) if text is not None else None) or []
            self.stored[jid] = reasons
            if reasons:
                self._stored_some.add(jid)
            if can_share(sj):
                self._sharers.add(jid)
            if facts.workload is not None:
                self.workloads[jid] = facts.workload
        self._reorder(removed, added, replaced)
        return removed, [at for at, _ in added], [at for at, _ in replaced]

    def _reorder(
        self,
        removed: list[tuple[float, str]],
        added: list[tuple[tuple[float, str], SchedJob]],
        replaced: list[tuple[tuple[float, str], SchedJob]],
    ) -> None:
        """The queue in the order of submission with the jobs removed, added and replaced: in place when they are
        few (a new job goes at the end, in C), sorted again when they are many."""
        order, jobs = self._order, self._jobs
        if len(removed) + len(added) > max(_REORDER_IN_PLACE, len(order) // 32):
            pairs = sorted(((bf[0][_SUBMITTED], jid), sj) for jid, (bf, sj) in self._built.items())
            self._order = [at for at, _ in pairs]
            self._jobs = [sj for _, sj in pairs]
            return
        for at in removed:
            i = bisect_left(order, at)
            del order[i], jobs[i]
        for at, sj in sorted(added, key=lambda a: a[0]):
            i = bisect_left(order, at)
            order.insert(i, at)
            jobs.insert(i, sj)
        for at, sj in replaced:
            jobs[bisect_left(order, at)] = sj
