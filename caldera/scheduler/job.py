"""A job as a scheduling policy sees it, queued or running.

Its own module, below the snapshot, the placement index and the sharing data, which all use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from caldera.core.cluster import Allocation
from caldera.core.resources import Resources
from caldera.core.tenancy import PriorityClass


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
    def waiting_since(self) -> float:
        """When it last entered the queue: ``queued_since``, else its submission."""
        return self.queued_since if self.queued_since is not None else self.submitted_at

    @property
    def runtime_s(self) -> float | None:
        """How long it is expected to run: its limit if it has one, else the caller's estimate (None: unknown)."""
        return self.max_runtime_s or self.expected_runtime_s
