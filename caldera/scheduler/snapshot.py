"""What a scheduling policy sees and what it decides.

A policy is a pure function ``Snapshot -> Decisions``. The live loop builds the snapshot from the database and the
runtimes; the simulator builds it from a trace. Neither may depend on how the other does it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from caldera.core.cluster import Allocation, Node
from caldera.core.tenancy import QueueConfig
from caldera.scheduler.job import SchedJob
from caldera.scheduler.placement import ClusterIndex
from caldera.scheduler.queue_memo import QueueChanges, QueueMemo
from caldera.scheduler.sharing_info import SharingInfo

__all__ = ["Decisions", "Policy", "Preempt", "Reason", "SchedJob", "Snapshot", "Start"]


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
    # The queued jobs' features kept from the previous cycle, when the caller keeps the job objects from cycle to
    # cycle (the simulator does; see caldera/scheduler/queue_memo.py for the contract). None: read the queue whole.
    queue_memo: QueueMemo | None = None
    # How ``queued`` differs from the previous snapshot's besides the jobs started and those added at its end (jobs
    # taken out of or put back into its middle), for the memo: it reads those jobs instead of the whole queue.
    queue_changes: QueueChanges | None = None


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
