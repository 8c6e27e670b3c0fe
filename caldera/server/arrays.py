"""Job arrays: one spec submitted as N tasks (``--array 0-99%8``). Each task is a job the scheduler sees like any
other, under the same quotas and per-user caps; its array's ``%N`` is kept by ``holds.withhold``, which offers the
scheduler no more of an array's tasks than may run. Cancel, hold and release act on every task at once."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from caldera.core.arrays import array_state, parse_array
from caldera.core.spec import JobSpec
from caldera.core.states import JobState
from caldera.core.tenancy import Role
from caldera.db.models import Job, JobArray, User
from caldera.server import holds, jobs
from caldera.server.errors import Invalid
from caldera.server.platform import Platform


def submit(p: Platform, db: Session, user: User, spec: JobSpec, expression: str) -> JobArray:
    """Checked once as one job would be (every task has the same spec), then made into its tasks."""
    try:
        wanted = parse_array(expression, p.settings.max_array_size)
    except ValueError as exc:
        params = {"error": str(exc)}
        raise Invalid("array", f"{expression[:64]!r}: {exc}", "BadArray", params) from None
    spec, account, queue = jobs.admissible(p, db, user, spec)
    now = time.time()
    ids = jobs.new_ids(db, len(wanted.indices) + 1)
    array = JobArray(
        id=ids.pop(),
        user_id=user.id,
        name=spec.name,
        expression=wanted.expression,
        size=len(wanted.indices),
        max_running=wanted.max_running,
        submitted_at=now,
    )
    db.add(array)
    db.flush()  # the array's row first: its tasks name it
    with db.no_autoflush:  # the tasks go in one flush, in batches, not one statement each
        for index, job_id in zip(wanted.indices, ids, strict=True):
            jobs.create(db, user, spec, account, queue, now, (array.id, index), job_id)
    db.flush()
    return array


def tasks(db: Session, array: JobArray) -> list[Job]:
    """The array's tasks, lowest index first."""
    return list(db.scalars(select(Job).where(Job.array_id == array.id).order_by(Job.array_index)))


def each_task(db: Session, array: JobArray, act: Callable[[Job], Any], states: tuple[str, ...]) -> None:
    """``act`` on the array's tasks in these states, lowest index first."""
    for job in tasks(db, array):
        if job.state in states:
            act(job)


_WAITING = (JobState.PENDING.value, JobState.QUEUED.value)
_LIVE = tuple(s.value for s in JobState if not s.terminal)


def cancel(p: Platform, db: Session, array: JobArray, actor: User) -> None:
    each_task(db, array, lambda job: jobs.cancel(p, db, job, actor), _LIVE)


def hold(db: Session, array: JobArray, actor: User, why: str = "") -> None:
    each_task(db, array, lambda job: holds.hold(db, job, actor, why), _WAITING)


def release(db: Session, array: JobArray, actor: User) -> None:
    each_task(db, array, lambda job: holds.release(db, job, actor), _WAITING)


def view(
    array: JobArray, counts: dict[str, int], username: str | None, first: Any, listed: list[Job] | None = None
) -> dict[str, Any]:
    """The array as the API shows it: its tasks' states counted, its account and queue (those of ``first``, its
    lowest-index task: all share one spec), and with ``listed`` each task's id, state and exit code."""
    out = {
        "id": array.id,
        "name": array.name,
        "user": username,
        "account": first.account if first else None,
        "queue": first.queue if first else None,
        "array": array.expression,
        "size": array.size,
        "max_running": array.max_running,
        "submitted_at": array.submitted_at,
        "state": state_of(counts),
        "counts": counts,
    }
    if listed is not None:
        out["tasks"] = [
            {"index": j.array_index, "id": j.id, "state": j.state, "exit_code": j.exit_code, "reason": j.reason}
            for j in listed
        ]
    return out


def state_of(counts: dict[str, int]) -> str:
    """The array's state from its tasks' states counted (no task left: cancelled before any was made)."""
    return array_state(JobState(s) for s in counts).value if counts else JobState.CANCELLED.value


def counts_of(db: Session, array_ids: list[str]) -> dict[str, dict[str, int]]:
    """Each array's tasks counted by state, in one query that loads no task: a page of arrays, each of thousands."""
    out: dict[str, dict[str, int]] = {a: {} for a in array_ids}
    if array_ids:
        counted = select(Job.array_id, Job.state, func.count()).where(Job.array_id.in_(array_ids))
        for array_id, state, n in db.execute(counted.group_by(Job.array_id, Job.state)):
            out[array_id][state] = n
    return out


def firsts_of(db: Session, array_ids: list[str]) -> dict[str, Any]:
    """Each array's lowest-index task's account and queue, in one query that loads no other task."""
    if not array_ids:
        return {}
    lowest = (
        select(Job.array_id, func.min(Job.array_index).label("index"))
        .where(Job.array_id.in_(array_ids))
        .group_by(Job.array_id)
        .subquery()
    )
    firsts = select(Job.array_id, Job.account, Job.queue).join(
        lowest, (Job.array_id == lowest.c.array_id) & (Job.array_index == lowest.c.index)
    )
    return {row.array_id: row for row in db.execute(firsts)}


def list_arrays(db: Session, user: User, everyone: bool = False, limit: int = 200) -> list[JobArray]:
    """Newest first; an admin's ``everyone``: all users' arrays."""
    q = select(JobArray)
    if not (everyone and user.role == Role.ADMIN.value):
        q = q.where(JobArray.user_id == user.id)
    return list(db.scalars(q.order_by(JobArray.submitted_at.desc()).limit(limit)))
