"""The queue view: the jobs waiting in my queues in the scheduler's order, others' without private detail, and my
fair-share standing computed by the scheduler's own FairShare from the stored usage."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from caldera.core.states import JobState
from caldera.db.models import Job, Usage, User
from caldera.scheduler.fairshare import FairShare
from caldera.server import api_admin, tenancy
from caldera.server.loop import ACTIVE
from caldera.server.queue_positions import QueuePositions

MAX_ROWS = 200  # per queue: enough to see what is ahead, without sending a 100,000-job queue to a browser


@dataclass
class Waiting:
    """One queued job as anyone in the queue may see it: no name, command, env or logs unless it is mine."""

    position: int | None
    user: str
    gpus: int
    gpu_model: str | None
    queued_at: float
    mine: bool
    id: str | None = None
    name: str | None = None


def _waiting(job: Job, user: User, names: dict[int, str], positions: QueuePositions) -> Waiting:
    res = job.spec.get("resources", {})
    mine = job.user_id == user.id
    return Waiting(
        position=positions.position(job),  # None before the scheduler's first cycle
        user=names.get(job.user_id, "?"),
        gpus=res.get("gpu", 0) * job.spec.get("replicas", 1),
        gpu_model=res.get("gpu_model"),
        queued_at=job.queued_at or job.submitted_at,
        mine=mine,
        id=job.id if mine else None,
        name=job.name if mine else None,
    )


def _ahead(rows: list[Waiting]) -> list[Waiting]:
    """In order, up to my last waiting job (what is ahead of mine); the whole queue when none of mine waits."""
    rows.sort(key=lambda w: (w.position is None, w.position or 0, w.queued_at))
    last = max((i for i, w in enumerate(rows) if w.mine), default=len(rows) - 1)
    return rows[: last + 1][:MAX_ROWS]


def queue_view(db: Session, user: User, positions: QueuePositions) -> dict:
    mine = api_admin.my_usage(user=user, db=db)
    names = tenancy.usernames(db)
    my_queues = {q["queue"] for q in mine["queues"]}
    live = list(db.scalars(select(Job).where(Job.state.in_((JobState.QUEUED.value, *ACTIVE)))))
    waiting: dict[str, list[Waiting]] = {q: [] for q in sorted(my_queues)}
    for job in live:
        if job.state == JobState.QUEUED.value and job.queue in my_queues:
            waiting[job.queue].append(_waiting(job, user, names, positions))
    usage = {u.key: u.value for u in db.scalars(select(Usage))}
    fs = FairShare(
        tenancy.all_queue_configs(db),
        {k[6:]: v for k, v in usage.items() if k.startswith("queue:")},
        {k[5:]: v for k, v in usage.items() if k.startswith("user:")},
        active_queues={j.queue for j in live} | my_queues,
        active_users={names.get(j.user_id, "?") for j in live} | {user.username},
    )
    standing = [
        {
            "queue": q,
            "queue_factor": fs.queue_factor(q),
            "user_factor": fs.user_factor(user.username),
            "factor": fs.factor(q, user.username),
        }
        for q in sorted(my_queues)
    ]
    return {
        "queues": {q: _ahead(rows) for q, rows in waiting.items()},
        "standing": standing,
        "gpu_hours": mine["decayed_gpu_seconds"] / 3600,
        "active_users": fs.n_users,
    }
