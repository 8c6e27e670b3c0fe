"""Run times learned from each user's finished jobs, given to the policy as ``SchedJob.expected_runtime_s``.

Users tend to submit similar jobs, so the mean run time of a user's most recent successful jobs of the same kind is
a usable estimate for the next one where the spec declares no ``max_runtime_s`` (the simulator learns them the
same way from a trace, ``caldera/sim/history.py``). Policies use it for backfill, reservations, estimated starts
and patience; it never stops a job.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session

from caldera.core.states import JobState
from caldera.db.models import Job

WINDOW = 10  # the last this many successful jobs of a user and kind


def run_time_s(job: Job) -> float | None:
    """How long a finished job ran, over all its attempts: its GPU-seconds over its GPUs (exact across
    preemptions), or its last attempt's wall time for a CPU-only job."""
    r = job.spec.get("resources", {})
    gpus = int(r.get("gpu", 0)) * int(job.spec.get("replicas", 1))
    if gpus and job.attained_gpu_s > 0:
        return job.attained_gpu_s / gpus
    if job.started_at is not None and job.finished_at is not None:
        return max(0.0, job.finished_at - job.started_at)
    return None


def expected_runtimes(db: Session, keys: Iterable[tuple[int, str]]) -> dict[tuple[int, str], float]:
    """``{(user id, kind): mean run time of that user's last WINDOW succeeded jobs of that kind}``, for the keys
    that have any."""
    out: dict[tuple[int, str], float] = {}
    for user_id, kind in set(keys):
        rows = db.scalars(
            select(Job)
            .where(Job.user_id == user_id, Job.kind == kind, Job.state == JobState.SUCCEEDED.value)
            .order_by(Job.finished_at.desc())
            .limit(WINDOW)
        )
        times = [t for t in map(run_time_s, rows) if t is not None]
        if times:
            out[(user_id, kind)] = sum(times) / len(times)
    return out
