"""Why a queued job is not starting: the stable reason codes, their messages, and cheap ``QueuePosition`` reasons.

Codes (``Reason.code``; stable, tests and clients match on them):

=========================  ===========================================================================================
``QueueCapability``        the job's queue would go over its capability (hard ceiling) for a resource
``UserCap``                a per-user cap in the queue (``max_gpus``, ``max_interactive_jobs``, ``max_running_jobs``)
``GangNoFit``              the gang does not fit the free capacity now (all replicas or none)
``QueuePosition``          waiting behind others; ``details``: ``position`` and ``estimated_start`` (epoch seconds,
                           None when it cannot be estimated)
``Reserved``               the job waited past the starvation threshold and holds a reservation
``BackfillBlocked``        it would fit now, but only on resources reserved for a starving job, and its
                           ``max_runtime_s`` (or the lack of one) does not end before the reservation
``WaitingForPreemption``   jobs were preempted (now or earlier) to make room for it; waiting for them to go
``BestEffortNoIdle``       best-effort jobs run only on idle capacity and none fits now
``NeverFits``              the job can never fit this cluster (normally refused at submission)
``SharingDeclined``        a shareable job was not put on an occupied GPU: the closest predicted slowdown past a
                           tolerance, an unknown workload, or no GPU with room (caldera/scheduler/sharing.py);
                           ``details``: ``tolerance``
=========================  ===========================================================================================

Every queued job that does not start gets at least one reason, and always a ``QueuePosition`` one last. With
100,000 queued jobs building that many Reason objects eagerly costs more than the whole scheduling cycle, so the
``QueuePosition`` reasons are :class:`QueuePositionReason` objects: real :class:`Reason` instances (same ``code``,
``message``, ``details``, equality, ``repr``, pickling and ``dataclasses.asdict``) whose message and details are
rendered on first access from a context shared by the whole cycle. A caller that keeps only what a job's reasons
say of the job itself reads :func:`specific_reasons`, which makes no ``QueuePosition`` reason at all.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from caldera.scheduler.snapshot import Reason, SchedJob

QUEUE_CAPABILITY = "QueueCapability"
USER_CAP = "UserCap"
GANG_NO_FIT = "GangNoFit"
QUEUE_POSITION = "QueuePosition"
RESERVED = "Reserved"
BACKFILL_BLOCKED = "BackfillBlocked"
WAITING_FOR_PREEMPTION = "WaitingForPreemption"
BEST_EFFORT_NO_IDLE = "BestEffortNoIdle"
NEVER_FITS = "NeverFits"
SHARING_DECLINED = "SharingDeclined"

CODES = (
    QUEUE_CAPABILITY,
    USER_CAP,
    GANG_NO_FIT,
    QUEUE_POSITION,
    RESERVED,
    BACKFILL_BLOCKED,
    WAITING_FOR_PREEMPTION,
    BEST_EFFORT_NO_IDLE,
    NEVER_FITS,
    SHARING_DECLINED,
)

# Preempt.reason codes
PREEMPT_RECLAIM = "Reclaim"  # a queue below its guarantee takes back from one above its deserved share
PREEMPT_BEST_EFFORT = "BestEffort"  # best-effort work gives way to anyone else
PREEMPT_PRIORITY = "Priority"  # a higher priority class in the same queue
PREEMPT_LAS = "LeastAttainedService"  # tiresias: a job with less attained service


def num(x: float) -> int | float:
    """8.0 -> 8 for messages and details."""
    if isinstance(x, float) and x.is_integer():
        return int(x)
    return x


_HHMM: dict[int, str] = {}


def hhmm(t: float) -> str:
    """Local wall-clock HH:MM of an epoch time (memoised per minute)."""
    k = int(t // 60)
    s = _HHMM.get(k)
    if s is None:
        if len(_HHMM) > 4096:
            _HHMM.clear()
        try:
            s = time.strftime("%H:%M", time.localtime(k * 60))
        except (OverflowError, OSError, ValueError):
            s = "?"
        _HHMM[k] = s
    return s


def gpus_phrase(g: int) -> str:
    return f"{g} GPU" if g == 1 else f"{g} GPUs"


# ------------------------------------------------------------------------------------------------ QueuePosition
class PositionContext:
    """What the QueuePosition reasons of one cycle share: the pending jobs in scheduling order, and what is needed
    to estimate when each starts.

    The estimate is an aggregate list-scheduling replay, done lazily and only as far as the positions read: GPUs
    free now, plus GPUs of running jobs as each reaches ``started_at + max_runtime_s`` (or the default estimate),
    handed to the pending jobs strictly in order; each then runs for its own estimate. It ignores node boundaries,
    quotas and backfill, so it is a rough, usually pessimistic figure. ``estimated_start`` is None when the job is
    larger than the cluster.
    """

    def __init__(
        self,
        now: float,
        pending: list[SchedJob] | Callable[[], list[SchedJob]],
        free_gpus: int,
        total_gpus: int,
        releases: list[tuple[float, int]] | Callable[[], list[tuple[float, int]]],
        runtime_estimate: Callable[[SchedJob], float],
        extra: dict[str, Any] | None = None,
        extra_text: str = "",
        extra_from: int = 1,
    ) -> None:
        self.now = now
        self._pending = pending
        self.free = free_gpus
        self.total = total_gpus
        self._releases: list[tuple[float, int]] | Callable[[], list[tuple[float, int]]] | None = releases
        self.runtime = runtime_estimate
        self.extra = extra or {}
        self.extra_text = extra_text
        self.extra_from = extra_from  # positions from this one on get ``extra``
        self._est: list[float | None] = []
        self._heap: list[tuple[float, int]] | None = None
        self._t = now

    @property
    def pending(self) -> list[SchedJob]:
        """The pending jobs in scheduling order (built on first use when given as a function)."""
        if callable(self._pending):
            self._pending = self._pending()
        return self._pending

    def estimate(self, pos: int) -> float | None:
        est = self._est
        if pos <= len(est):
            return est[pos - 1]
        if self._heap is None:
            rel = self._releases() if callable(self._releases) else self._releases or []
            self._heap = [(max(t, self.now), g) for t, g in rel if g > 0]
            self._releases = None
            heapq.heapify(self._heap)
        heap = self._heap
        pending = self.pending
        free = self.free
        t = self._t
        total = self.total
        push, pop = heapq.heappush, heapq.heappop
        while len(est) < pos and len(est) < len(pending):
            job = pending[len(est)]
            need = job.request.gpu * job.replicas
            if need > total:
                est.append(None)
                continue
            while free < need and heap:
                tt, g = pop(heap)
                if tt > t:
                    t = tt
                free += g
            if free < need:
                est.append(None)
                continue
            free -= need
            est.append(t)
            if need:
                push(heap, (t + self.runtime(job), need))
        self.free = free
        self._t = t
        return est[pos - 1] if pos <= len(est) else None

    def message(self, pos: int) -> str:
        t = self.estimate(pos)
        s = f"position {pos} in the queue{self.extra_text if pos >= self.extra_from else ''}"
        if t is not None:
            s += f", estimated start at {hhmm(t)}"
        return s

    def details(self, pos: int) -> dict[str, Any]:
        d = {"position": pos, "estimated_start": self.estimate(pos)}
        if self.extra and pos >= self.extra_from:
            d.update(self.extra)
        return d


class QueuePositionReason(Reason):
    """A ``QueuePosition`` :class:`Reason` rendered lazily from its cycle's :class:`PositionContext`."""

    __slots__ = ("_pos", "_ctx")
    _pos: int
    _ctx: PositionContext
    code = QUEUE_POSITION  # shadows the dataclass slot: the same for every instance

    @property
    def position(self) -> int:
        """The job's place in the queue, without rendering the rest (its estimated start needs the jobs ahead)."""
        return self._pos

    @property
    def message(self) -> str:  # type: ignore[override]
        return self._ctx.message(self._pos)

    @property
    def details(self) -> dict[str, Any]:  # type: ignore[override]
        return self._ctx.details(self._pos)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Reason):
            return (self.code, self.message, self.details) == (other.code, other.message, other.details)
        return NotImplemented

    __hash__ = Reason.__hash__

    def __repr__(self) -> str:
        return f"Reason(code={self.code!r}, message={self.message!r}, details={self.details!r})"

    def __reduce__(self) -> tuple:
        return (Reason, (self.code, self.message, self.details))


_new = object.__new__
_set_pos = QueuePositionReason.__dict__["_pos"].__set__
_set_ctx = QueuePositionReason.__dict__["_ctx"].__set__


class LazyPending(Mapping[str, list[Reason]]):
    """A ``Decisions.pending`` that makes each job's reasons when read, and can give the reasons that do not follow
    from the queue's order without making the ``QueuePosition`` ones."""

    __slots__ = ()

    def specific(self) -> Iterator[tuple[str, Sequence[Reason]]]:
        return _without_positions(self)

    def said(self) -> tuple[dict[str, Sequence[Reason]], set[str]] | None:
        """See :func:`said_reasons`; None here (a subclass that knows says)."""
        return None


def specific_reasons(pending: Mapping[str, list[Reason]]) -> Iterator[tuple[str, Sequence[Reason]]]:
    """(job id, its reasons but the ``QueuePosition`` one) for every job of ``Decisions.pending``: what the cycle
    says of the job itself, which changes rarely, without its place and estimated start, which one start or arrival
    moves for every job behind it."""
    if isinstance(pending, LazyPending):
        return pending.specific()
    return _without_positions(pending)


def said_reasons(pending: Mapping[str, list[Reason]]) -> tuple[dict[str, Sequence[Reason]], set[str]] | None:
    """Of ``Decisions.pending``: each job's reasons but the ``QueuePosition`` one, for the jobs that have any, and
    the snapshot's queued jobs it leaves out (those that start); None where it cannot tell them apart from the
    others (then :func:`specific_reasons`). Every other job of the snapshot's queue is pending with no reason but its
    place: on a long queue most of it, which this does not pass over."""
    if isinstance(pending, LazyPending):
        return pending.said()
    return None


def _without_positions(pending: Mapping[str, list[Reason]]) -> Iterator[tuple[str, Sequence[Reason]]]:
    return ((job_id, [r for r in reasons if r.code != QUEUE_POSITION]) for job_id, reasons in pending.items())


class PendingReasons(LazyPending):
    """``Decisions.pending``: job id -> reasons, for every queued job that did not start, in the snapshot's order.

    A job's list (its specific reasons, then its ``QueuePosition``) is made the first time it is read and kept, so
    a cycle that leaves 100,000 jobs waiting costs nothing per job until someone looks: the live loop reads them
    all, but after the cycle, and the simulator never does.
    """

    __slots__ = ("_jobs", "_started", "_first", "_positions", "_ctx", "_index", "_made")

    def __init__(
        self,
        jobs: list[SchedJob],
        started: Iterable[int],
        first: dict[int, list[Reason]],
        positions: Callable[[], list[int]],
        ctx: PositionContext,
    ) -> None:
        self._jobs = jobs  # the snapshot's queued jobs
        self._started = set(started)  # indices into jobs
        self._first = first  # index -> reasons that come before the QueuePosition one
        self._positions: Callable[[], list[int]] | list[int] = positions  # per index, resolved on first use
        self._ctx = ctx
        self._index: dict[str, int] | None = None
        self._made: dict[int, list[Reason]] = {}

    def _reasons(self, k: int) -> list[Reason]:
        lst = self._made.get(k)
        if lst is None:
            pos = self._positions
            if callable(pos):
                pos = self._positions = pos()
            r = _new(QueuePositionReason)
            _set_ctx(r, self._ctx)
            _set_pos(r, pos[k])
            lst = self._made[k] = [*self._first.get(k, ()), r]
        return lst

    def __getitem__(self, job_id: str) -> list[Reason]:
        if self._index is None:
            self._index = {j.id: k for k, j in enumerate(self._jobs)}
        k = self._index.get(job_id)
        if k is None or k in self._started:
            raise KeyError(job_id)
        return self._reasons(k)

    def __iter__(self) -> Iterator[str]:
        started = self._started
        return (j.id for k, j in enumerate(self._jobs) if k not in started)

    def __len__(self) -> int:
        return len(self._jobs) - len(self._started)

    def items(self) -> Iterator[tuple[str, list[Reason]]]:  # type: ignore[override]
        started = self._started
        make = self._reasons
        return ((j.id, make(k)) for k, j in enumerate(self._jobs) if k not in started)

    def specific(self) -> Iterator[tuple[str, Sequence[Reason]]]:
        started, first = self._started, self._first
        return ((j.id, first.get(k, ())) for k, j in enumerate(self._jobs) if k not in started)

    def said(self) -> tuple[dict[str, Sequence[Reason]], set[str]]:
        jobs, started = self._jobs, self._started
        said: dict[str, Sequence[Reason]] = {
            jobs[k].id: r for k, r in sorted(self._first.items()) if r and k not in started
        }
        return said, {jobs[k].id for k in started}

    def __repr__(self) -> str:
        return f"PendingReasons({len(self)} jobs)"
