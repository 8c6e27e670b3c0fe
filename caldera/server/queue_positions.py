"""The queued jobs' places in the scheduler's order as its last cycle left them, kept in memory and put into a
job's pending reasons when the API or the portal shows them.

A queued job's stored reasons (``Job.pending_reasons``) hold what the cycle said of the job itself (a quota, a gang
that does not fit, a hold), which changes rarely. Its ``QueuePosition`` reason (its place and estimated start)
follows from the whole queue's order: one start or arrival moves it for every job behind. Stored, it had every
cycle render and compare every queued job's reasons (seconds at 100,000 queued; docs/scheduler-efficiency.md).
So the loop hands each cycle's pending reasons to :class:`QueuePositions`, which renders a job's place only when
someone reads it. After a restart a queued job shows its place again after the first cycle.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from caldera.core.states import JobState
from caldera.db.models import Job
from caldera.scheduler.reasons import QUEUE_POSITION, QueuePositionReason
from caldera.scheduler.snapshot import Reason

_QUEUED = JobState.QUEUED.value


class QueuePositions:
    """The last cycle's ``Decisions.pending``, read for the ``QueuePosition`` reasons."""

    def __init__(self) -> None:
        self._pending: Mapping[str, list[Reason]] = {}
        # the reasons are made when first read (reasons.PendingReasons), and the API's threads may read at once
        self._reading = threading.Lock()

    def after_cycle(self, pending: Mapping[str, list[Reason]]) -> None:
        """The pending reasons of the cycle just committed (empty: no job has a place)."""
        self._pending = pending

    def shown(self, job: Job) -> list[dict[str, Any]]:
        """Why the job waits, as a person reads it: its stored reasons and, while it is queued, its place from the
        last cycle (instead of one stored before places were kept here)."""
        stored = job.pending_reasons or []
        with self._reading:
            place = self._place(job)
            if place is None:
                return stored
            return [*(r for r in stored if r.get("code") != QUEUE_POSITION), as_stored(place)]

    def position(self, job: Job) -> int | None:
        """The job's place in the last cycle's order; None when that cycle did not order it."""
        with self._reading:
            place = self._place(job)
            if place is None:
                return None
            if isinstance(place, QueuePositionReason):  # its place alone: the estimate replays the jobs ahead
                return place.position
            return place.details.get("position")

    def _place(self, job: Job) -> Reason | None:
        if job.state != _QUEUED or job.hold is not None:  # held since the cycle: offered to no policy now
            return None
        reasons = self._pending.get(job.id)
        if not reasons or reasons[-1].code != QUEUE_POSITION:
            return None
        return reasons[-1]


def as_stored(reason: Reason) -> dict[str, Any]:
    """A reason as ``Job.pending_reasons`` and the API hold it."""
    return {"code": reason.code, "message": reason.message, "details": reason.details}
