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
=========================  ===========================================================================================

Every queued job that does not start gets at least one reason, and always a ``QueuePosition`` one last. With
100,000 queued jobs building that many Reason objects eagerly costs more than the whole scheduling cycle, so the
``QueuePosition`` reasons are :class:`QueuePositionReason` objects: real :class:`Reason` instances (same ``code``,
``message``, ``details``, equality, ``repr``, pickling and ``dataclasses.asdict``) whose message and details are
rendered on first access from a context shared by the whole cycle.
"""
from __future__ import annotations

import heapq
import time
from collections import deque
from itertools import repeat
from operator import attrgetter
from typing import Any, Callable

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

CODES = (QUEUE_CAPABILITY, USER_CAP, GANG_NO_FIT, QUEUE_POSITION, RESERVED, BACKFILL_BLOCKED,
         WAITING_FOR_PREEMPTION, BEST_EFFORT_NO_IDLE, NEVER_FITS)

# Preempt.reason codes
PREEMPT_RECLAIM = "Reclaim"            # a queue below its guarantee takes back from one above its deserved share
PREEMPT_BEST_EFFORT = "BestEffort"     # best-effort work gives way to anyone else
PREEMPT_PRIORITY = "Priority"          # a higher priority class in the same queue
PREEMPT_LAS = "LeastAttainedService"   # tiresias: a job with less attained service


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

    def __init__(self, now: float, pending: list[SchedJob] | Callable[[], list[SchedJob]], free_gpus: int,
                 total_gpus: int, releases: list[tuple[float, int]] | Callable[[], list[tuple[float, int]]],
                 runtime_estimate: Callable[[SchedJob], float],
                 extra: dict[str, Any] | None = None, extra_text: str = "", extra_from: int = 1) -> None:
        self.now = now
        self._pending = pending
        self.free = free_gpus
        self.total = total_gpus
        self._releases = releases
        self.runtime = runtime_estimate
        self.extra = extra or {}
        self.extra_text = extra_text
        self.extra_from = extra_from      # positions from this one on get ``extra``
        self._est: list[float | None] = []
        self._lists: tuple[list[SchedJob], dict[str, list[Reason]]] | None = None
        self._positions: Callable[[], list[int]] | None = None
        self._posmap: dict[int, int] | None = None
        self._heap: list[tuple[float, int]] | None = None
        self._t = now

    def attach(self, jobs: list[SchedJob], pending: dict[str, list[Reason]],
               positions: Callable[[], list[int]]) -> None:
        self._lists = (jobs, pending)
        self._positions = positions

    def position_of(self, r: Reason) -> int:
        if self._posmap is None:
            assert self._lists is not None and self._positions is not None
            jobs, pending = self._lists
            pm: dict[int, int] = {}
            get = pending.get
            for job, p in zip(jobs, self._positions()):
                lst = get(job.id)
                if not lst:
                    continue
                x = lst[-1]
                if not isinstance(x, QueuePositionReason):     # someone appended to the list: find ours
                    x = next((y for y in lst if isinstance(y, QueuePositionReason)), None)
                    if x is None:
                        continue
                pm[id(x)] = p
            self._posmap = pm
            self._lists = None            # no reference back to the reasons any more
            self._positions = None
        return self._posmap[id(r)]

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
            rel = self._releases() if callable(self._releases) else self._releases
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
    code = QUEUE_POSITION     # shadows the dataclass slot: the same for every instance

    def _position(self) -> int:
        try:
            return self._pos
        except AttributeError:          # large queues: positions are resolved on first access
            p = self._ctx.position_of(self)
            _set_pos(self, p)
            return p

    @property
    def message(self) -> str:  # type: ignore[override]
        return self._ctx.message(self._position())

    @property
    def details(self) -> dict[str, Any]:  # type: ignore[override]
        return self._ctx.details(self._position())

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
_LARGE = 2048
_ID = attrgetter("id")


def build_pending(jobs: list[SchedJob], positions: Callable[[], list[int]], ctx: PositionContext
                  ) -> dict[str, list[Reason]]:
    """``Decisions.pending`` with one QueuePosition reason per job: ``jobs[k]`` is at ``positions()[k]``.

    Large queues: one pass creating the lists and reason objects (the cheapest way to make 100,000 of them); the
    context lives on a per-cycle subclass and resolves positions on first access. Until then the context refers to
    the dict (a reference cycle the garbage collector clears if nothing ever reads the reasons); the first access
    drops that reference, so read decisions are freed by reference counting. Small queues set positions directly."""
    n = len(jobs)
    if n >= _LARGE:
        cls = type("QueuePositionReason", (QueuePositionReason,), {"__slots__": (), "_ctx": ctx})
        new = _new
        pending = {j.id: [new(cls)] for j in jobs}
        ctx.attach(jobs, pending, positions)
        return pending
    objs = list(map(_new, repeat(QueuePositionReason, n)))
    deque(map(_set_ctx, objs, repeat(ctx, n)), maxlen=0)
    deque(map(_set_pos, objs, positions()), maxlen=0)
    return dict(zip(map(_ID, jobs), map(list, zip(objs))))
