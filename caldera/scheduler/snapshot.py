"""What a scheduling policy sees and what it decides.

A policy is a pure function ``Snapshot -> Decisions``. The live loop builds the snapshot from the database and the
runtimes; the simulator builds it from a trace. Neither may depend on how the other does it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from caldera.core.cluster import Allocation, Node
from caldera.core.resources import Resources
from caldera.core.tenancy import PriorityClass, QueueConfig

if TYPE_CHECKING:
    from caldera.scheduler.placement import ClusterIndex
    from caldera.scheduler.sharing import SharingInfo


@dataclass(slots=True)
class SchedJob:
    id: str
    user: str
    account: str
    queue: str
    priority: PriorityClass
    request: Resources  # per replica
    replicas: int = 1
    submitted_at: float = 0.0  # first submission (seconds, any epoch shared with Snapshot.now)
    queued_since: float | None = None  # last time it entered the queue (re-queue after preemption)
    interactive: bool = False
    max_runtime_s: float | None = None
    attained_gpu_s: float = 0.0  # GPU-seconds received so far, over all attempts
    # running jobs only
    started_at: float | None = None
    allocations: tuple[Allocation, ...] = ()
    terminating: bool = False  # asked to stop (preempted or cancelled); resources not yet free
    preempted_by: str | None = None  # terminating because it was preempted for this queued job (the
    # Preempt.by_job_id that caused it); its resources are soon-free for
    # that job only. None while terminating: soon-free for anyone
    shareable: bool = False  # may share its GPU with other shareable jobs (caldera/scheduler/sharing.py)
    decay_tolerance: float | None = None  # the slowdown it accepts when shared; the queue's default when None

    # last: what the caller expects the job to run (e.g. learned from its user's past jobs), used like
    # max_runtime_s for backfill and reservations when the job declares none; None: unknown
    expected_runtime_s: float | None = None
    las: bool = True  # may be preempted for jobs with less attained service (a batch job that did not opt out)
    # how fast it runs on each GPU model, relative to one another (e.g. measured throughputs); a policy may put a
    # job that names no model on the fastest one free. None: the same everywhere
    speeds: Mapping[str, float] | None = None
    # how many times it was preempted so far, over all attempts (the simulator counts them; the live loop takes
    # its earlier attempts, each of which ended in a re-queue); a policy may stop preempting a job that paid for
    # many restarts
    preemptions: int = 0

    @property
    def gpus(self) -> int:
        return self.request.gpu * self.replicas

    @property
    def runtime_s(self) -> float | None:
        """How long it is expected to run: its limit if it has one, else the caller's estimate (None: unknown)."""
        return self.max_runtime_s or self.expected_runtime_s


@dataclass(slots=True)
class Snapshot:
    now: float
    nodes: list[Node]
    queued: list[SchedJob]
    running: list[SchedJob]
    queues: dict[str, QueueConfig] = field(default_factory=dict)
    user_usage: dict[str, float] = field(default_factory=dict)  # decayed GPU-seconds per user
    queue_usage: dict[str, float] = field(default_factory=dict)  # decayed GPU-seconds per queue
    # Free capacity of ``nodes`` net of the ``running`` allocations, when the caller keeps it up to date between
    # cycles (the simulator does); policies use a copy. None: policies compute it from ``nodes`` and ``running``.
    capacity: ClusterIndex | None = None
    # False when the caller never reads ``Decisions.pending`` (the simulator): policies may leave it empty.
    explain: bool = True
    # Predicted interference for GPU sharing, filled by the caller from the decay model; None: no sharing
    sharing: SharingInfo | None = None


@dataclass(slots=True, frozen=True)
class Start:
    job_id: str
    allocations: tuple[Allocation, ...]
    note: str = ""  # for people, added to the job's Scheduled event (e.g. whom it shares a GPU with, and why)


@dataclass(slots=True, frozen=True)
class Preempt:
    job_id: str
    by_job_id: str | None
    reason: str  # machine-readable, e.g. "Reclaim", "BestEffort", "Priority"
    message: str


@dataclass(slots=True, frozen=True)
class Reason:
    """Why a queued job is not starting now. ``code`` is stable; ``message`` is for humans."""

    code: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Decisions:
    starts: list[Start] = field(default_factory=list)
    preemptions: list[Preempt] = field(default_factory=list)
    pending: Mapping[str, list[Reason]] = field(default_factory=dict)  # a read-only mapping
    # Unless jobs arrive, end or change, the earliest time at which the policy could start or preempt anything:
    # ``inf`` when nothing but such a change can, None when the policy cannot tell (call it again soon). The
    # simulator skips its periodic cycles until then; the decisions of those cycles would be empty anyway.
    wake_at: float | None = None


class Policy(Protocol):
    name: str

    def __call__(self, snapshot: Snapshot, /) -> Decisions: ...
