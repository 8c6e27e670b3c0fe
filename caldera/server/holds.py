"""What keeps a queued job from the scheduler: a hold (its owner's or an admin's) or a dependency that has not ended
(``after`` in its spec, a job or a job array), or a task of an array that already runs as many tasks as its ``%N``
allows. The loop offers such a job to no policy; its pending reason says why, in ``why`` and the portal. Also an
admin's requeue of a running job, which is a preemption back to the queue."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from caldera.core.arrays import array_state
from caldera.core.spec import DependencyWhen
from caldera.core.states import JobState
from caldera.core.tenancy import Role
from caldera.db.models import Job, JobArray, User
from caldera.server.errors import Conflict, Forbidden
from caldera.server.jobs import note, record, request_preemption
from caldera.server.platform import Platform

_HOLDABLE = (JobState.PENDING.value, JobState.QUEUED.value)


def hold(db: Session, job: Job, actor: User, why: str = "") -> Job:
    """Keep a waiting job from starting until it is released; an admin's hold only an admin releases."""
    is_admin = actor.role == Role.ADMIN.value
    if job.user_id != actor.id and not is_admin:
        raise Forbidden("not your job")
    if job.state not in _HOLDABLE:
        raise Conflict(f"job {job.id} is {job.state}: only a waiting job can be held")
    if job.hold is None:
        job.hold = {"by": actor.username, "admin": is_admin, "at": time.time(), "note": why}
        note(db, job, "Held", _held_message(job.hold), _held_params(job.hold))
    job.pending_reasons = [_held_reason(job.hold)]
    return job


def release(db: Session, job: Job, actor: User) -> Job:
    if job.user_id != actor.id and actor.role != Role.ADMIN.value:
        raise Forbidden("not your job")
    if job.hold is None:
        return job
    if job.hold.get("admin") and actor.role != Role.ADMIN.value:
        raise Forbidden(f"held by admin {job.hold['by']}: only an admin releases it")
    job.hold = None
    job.pending_reasons = []
    note(db, job, "Released", f"released by {actor.username}", {"by": actor.username})
    return job


def requeue(p: Platform, db: Session, job: Job, admin: User, why: str = "") -> Job:
    """Stop a running job as a preemption does (SIGTERM with the notice, SIGKILL after the grace); the loop puts
    it back in its queue when its processes are gone."""
    if not JobState(job.state).active or job.stop_requested is not None:
        raise Conflict(f"job {job.id} is {job.state}: only a running job that is not stopping can be requeued")
    message = f"requeued by admin {admin.username}" + (f": {why}" if why else "")
    params = {"admin": admin.username, "note": why}
    request_preemption(p, db, job, None, "RequeuedByAdmin", message, time.time(), params)
    return job


def withhold(db: Session, queued: list[Job], now: float) -> set[str]:
    """The queued jobs the scheduler is not offered now, their pending reasons written; a job whose dependency can
    no longer be met (it failed under ``ok``) is cancelled here."""
    out = set()
    for job in queued:
        reasons = [_held_reason(job.hold)] if job.hold else []
        for after in job.spec.get("after") or ():
            waiting = _dependency(db, job, after, now)
            if waiting is False:
                out.add(job.id)
                break
            if waiting is not None:
                reasons.append(waiting)
        else:
            if reasons:
                out.add(job.id)
                if job.pending_reasons != reasons:
                    job.pending_reasons = reasons
    for job in _over_array_limits(db, [job for job in queued if job.id not in out]):
        out.add(job.id)
    return out


def _over_array_limits(db: Session, offered: list[Job]) -> list[Job]:
    """The tasks beyond their array's ``%N``: of those the scheduler would be offered, each array's lowest indices
    up to N less its tasks already starting or running; the others wait with the reason ``ArrayLimit``."""
    limited = {job.array_id for job in offered if job.array_id is not None}
    if not limited:
        return []
    limits = dict(db.execute(select(JobArray.id, JobArray.max_running).where(JobArray.id.in_(limited))).all())
    limits = {a: n for a, n in limits.items() if n is not None}
    if not limits:  # arrays without %N: no count of their running tasks to make, each cycle
        return []
    active = (JobState.STARTING.value, JobState.RUNNING.value)
    running = db.execute(
        select(Job.array_id, func.count()).where(Job.array_id.in_(limits), Job.state.in_(active)).group_by(Job.array_id)
    )
    room = {a: n for a, n in limits.items()}
    for array_id, count in running:
        room[array_id] -= count
    over = []
    for job in sorted(offered, key=lambda j: (j.array_id or "", j.array_index or 0)):
        if job.array_id not in room:
            continue
        if room[job.array_id] > 0:
            room[job.array_id] -= 1
            continue
        params = {"array": job.array_id, "limit": limits[job.array_id]}
        message = f"array {job.array_id} already runs {limits[job.array_id]} tasks, its limit (%{limits[job.array_id]})"
        reasons = [{"code": "ArrayLimit", "message": message, "details": params}]
        if job.pending_reasons != reasons:
            job.pending_reasons = reasons
        over.append(job)
    return over


def _dependency(db: Session, job: Job, after: dict[str, str], now: float) -> dict[str, Any] | None | bool:
    """None: met; a pending reason: not yet; False: never, and the job was cancelled for it."""
    dep_id, when = after["job"], after.get("when", DependencyWhen.OK.value)
    state = _state_of(db, dep_id)
    if state is JobState.SUCCEEDED or (state.terminal and when == DependencyWhen.ANY.value):
        return None
    if state.terminal:
        params = {"job": dep_id, "state": state.value}
        message = f"its dependency {dep_id} ended {state.value}, and it needed it to succeed"
        record(db, job, JobState.CANCELLED, "DependencyFailed", message, now, params)
        job.finished_at = now
        return False
    must_succeed = when == DependencyWhen.OK.value
    message = f"waiting for job {dep_id} to end (it is {state.value})" + ("; it must succeed" if must_succeed else "")
    params = {"job": dep_id, "state": state.value, "when": when, "must_succeed": must_succeed}
    return {"code": "Dependency", "message": message, "details": params}


def _state_of(db: Session, dep_id: str) -> JobState:
    """A job's state, or a job array's (Succeeded once every task did; see ``array_state``); Lost if neither is."""
    dep = db.get(Job, dep_id)
    if dep is not None:
        return JobState(dep.state)
    states = db.scalars(select(Job.state).where(Job.array_id == dep_id).distinct()).all()  # a few, not every task
    return array_state(JobState(s) for s in states) if states else JobState.LOST


def _held_params(h: dict[str, Any]) -> dict[str, Any]:
    return {"by": h["by"], "note": h.get("note") or ""}


def _held_message(h: dict[str, Any]) -> str:
    return f"held by {h['by']}" + (f": {h['note']}" if h.get("note") else "")


def _held_reason(h: dict[str, Any]) -> dict[str, Any]:
    return {"code": "Held", "message": _held_message(h), "details": _held_params(h)}
