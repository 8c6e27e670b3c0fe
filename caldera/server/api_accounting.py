"""Accounting, as Slurm's sacct: one row per job that ended in a window, with the GPU-hours it held (every attempt's,
as the loop charged them). Admins see everyone's jobs, others their own."""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends, Query
from sqlalchemy.orm import Session

from caldera.core.states import TERMINAL
from caldera.db.models import Job, User
from caldera.metrics.views import parse_since
from caldera.server import jobs, tenancy
from caldera.server.deps import current_user, db_session, platform
from caldera.server.errors import Invalid
from caldera.server.platform import Platform
from caldera.server.queue_positions import QueuePositions

router = APIRouter(prefix="/api/v1", tags=["jobs"])


@router.get("/accounting")
def accounting(
    since: str = Query("30d", max_length=16),
    limit: int = Query(10000, ge=1, le=100000),
    user: User = Depends(current_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
) -> dict:
    """The jobs that ended since ``since`` (7d, 12h, 2w or a UTC date), oldest end first."""
    now = time.time()
    try:
        start = parse_since(since, now)
    except ValueError as exc:
        raise Invalid("since", str(exc)) from None
    q = jobs.jobs_query(user, everyone=True, states=[s.value for s in TERMINAL]).where(Job.finished_at >= start)
    ended = db.scalars(q.order_by(Job.finished_at, Job.id).limit(limit))
    names = tenancy.usernames(db)
    return {
        "since": start,
        "until": now,
        "jobs": [row(job, names.get(job.user_id), p.queue_positions) for job in ended],
    }


_COLUMNS = ("id", "name", "user", "account", "queue", "state", "exit_code", "gpus")


def row(job: Job, username: str | None, positions: QueuePositions) -> dict:
    """The job's columns of ``jobs.view``, when it ran (its last attempt) and the GPU-hours of all its attempts."""
    shown = jobs.view(job, username, positions=positions)
    return {k: shown[k] for k in _COLUMNS} | {
        "start": job.started_at,
        "end": job.finished_at,
        "gpu_hours": round(job.attained_gpu_s / 3600, 4),
    }
