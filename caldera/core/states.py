"""The job state machine. Every transition is recorded as an event with a reason."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import Enum


class JobState(str, Enum):
    PENDING = "Pending"  # accepted, not yet admitted to a queue
    QUEUED = "Queued"  # waiting for the scheduler
    STARTING = "Starting"  # resources bound, processes being launched
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"
    PREEMPTED = "Preempted"  # stopped to free resources; goes back to Queued
    LOST = "Lost"  # its processes vanished without an exit status

    @property
    def terminal(self) -> bool:
        return self in TERMINAL

    @property
    def active(self) -> bool:
        """Holds resources on a node."""
        return self in (JobState.STARTING, JobState.RUNNING)


TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.LOST})

_ALLOWED: dict[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.QUEUED, JobState.CANCELLED, JobState.FAILED}),
    JobState.QUEUED: frozenset({JobState.STARTING, JobState.CANCELLED, JobState.FAILED}),
    JobState.STARTING: frozenset(
        {JobState.RUNNING, JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.PREEMPTED, JobState.LOST}
    ),
    JobState.RUNNING: frozenset(
        {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.PREEMPTED, JobState.LOST}
    ),
    JobState.PREEMPTED: frozenset({JobState.QUEUED, JobState.CANCELLED}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
    JobState.LOST: frozenset(),
}


class InvalidTransition(ValueError):
    pass


def can_transition(src: JobState, dst: JobState) -> bool:
    return dst in _ALLOWED[src]


def check_transition(src: JobState, dst: JobState) -> None:
    if not can_transition(src, dst):
        raise InvalidTransition(f"a job cannot go from {src.value} to {dst.value}")


@dataclass(frozen=True)
class JobEvent:
    """One recorded transition (or a notable fact, when ``from_state == to_state``)."""

    job_id: str
    from_state: JobState | None
    to_state: JobState
    reason: str  # machine-readable, CamelCase, e.g. "Scheduled", "ExitCode", "PreemptedBy"
    message: str = ""
    at: datetime = field(default_factory=lambda: datetime.now(UTC))
