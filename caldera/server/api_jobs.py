"""Jobs: submit, list, describe, events, logs, cancel, why pending."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from fastapi import APIRouter, Body, Depends, Header, HTTPException, Query
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field
from sqlalchemy.orm import Session

from caldera.core.spec import JobSpec
from caldera.core.states import JobState
from caldera.db.models import Job, User
from caldera.runtime.base import Handle
from caldera.server import audit, holds, jobs, tenancy
from caldera.server.deps import admin_user, current_user, db_session, platform
from caldera.server.errors import Invalid
from caldera.server.log_stream import Progress, live_events, parse_resume, sse_response
from caldera.server.params import DB_INT_MAX, Offset
from caldera.server.platform import Platform

router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"])
_MAX_LOG_OFFSET = 1 << 40  # past any log's end, and still a position every file system can seek to


def _check_rank(job: Job, rank: int | None) -> None:
    if rank is not None and rank >= job.spec.get("replicas", 1) * job.spec.get("procs_per_replica", 1):
        raise HTTPException(400, f"rank {rank} does not exist")


@router.post("", status_code=201)
def submit(
    spec: JobSpec = Body(...),  # validated like the CLI's YAML, and described in the OpenAPI document
    user: User = Depends(current_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
) -> dict:
    with p.state_lock:
        job = jobs.submit(p, db, user, spec)
        db.commit()
    return jobs.view(job, user.username, positions=p.queue_positions)


@router.get("")
def list_jobs(
    all: bool = False,
    state: list[str] | None = Query(None, max_length=len(JobState)),
    limit: int = Query(200, ge=1, le=5000),
    user: User = Depends(current_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
) -> list[dict]:
    if state:
        known = [s.value for s in JobState]
        bad = [x for x in state if x not in known]
        if bad:
            raise Invalid("state", f"unknown state {bad[0][:64]!r}; valid states: {', '.join(known)}")
    names = tenancy.usernames(db)
    shown = jobs.list_jobs(db, user, all, state, limit)
    return [jobs.view(j, names.get(j.user_id), positions=p.queue_positions) for j in shown]


@router.get("/{job_id}")
def describe(
    job_id: str, user: User = Depends(current_user), p: Platform = Depends(platform), db: Session = Depends(db_session)
) -> dict:
    job = jobs.visible(db, user, job_id)
    out = jobs.view(job, tenancy.username(db, job.user_id), positions=p.queue_positions)
    out["events"] = [jobs.event_view(e) for e in jobs.events(db, job)]
    return out


@router.get("/{job_id}/events")
def job_events(job_id: str, user: User = Depends(current_user), db: Session = Depends(db_session)) -> list[dict]:
    return [jobs.event_view(e) for e in jobs.events(db, jobs.visible(db, user, job_id))]


@router.get("/{job_id}/why")
def why(
    job_id: str, user: User = Depends(current_user), p: Platform = Depends(platform), db: Session = Depends(db_session)
) -> dict:
    job = jobs.visible(db, user, job_id)
    # STARTING too: a job handed to a runtime that admits jobs itself (Kubernetes) waits there, with its reasons
    waiting = (JobState.QUEUED.value, JobState.STARTING.value)
    reasons = p.queue_positions.shown(job) if job.state in waiting else []
    return {"id": job.id, "state": job.state, "reason": job.reason, "message": job.message, "pending": reasons}


@router.post("/{job_id}/cancel")
def cancel(
    job_id: str, user: User = Depends(current_user), p: Platform = Depends(platform), db: Session = Depends(db_session)
) -> dict:
    with p.state_lock:
        job = jobs.visible(db, user, job_id)
        jobs.cancel(p, db, job, user)
        db.commit()
    return jobs.view(job, user.username, positions=p.queue_positions)


class HoldIn(BaseModel):
    reason: str = Field("", max_length=1024)


@router.post("/{job_id}/hold")
def hold(
    job_id: str,
    body: HoldIn | None = None,
    user: User = Depends(current_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
) -> dict:
    """Keep a waiting job from starting (its owner or an admin) until it is released."""
    return _changed(p, db, user, job_id, lambda job: holds.hold(db, job, user, body.reason if body else ""))


@router.post("/{job_id}/release")
def release(
    job_id: str, user: User = Depends(current_user), p: Platform = Depends(platform), db: Session = Depends(db_session)
) -> dict:
    return _changed(p, db, user, job_id, lambda job: holds.release(db, job, user))


@router.post("/{job_id}/requeue")
def requeue(
    job_id: str,
    body: HoldIn | None = None,
    admin: User = Depends(admin_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
) -> dict:
    """Admins: stop a running job as a preemption does and put it back in its queue."""
    why = body.reason if body else ""

    def act(job: Job) -> Job:
        holds.requeue(p, db, job, admin, why)
        audit.record(db, admin, "requeue-job", job.id, {"reason": why})
        return job

    return _changed(p, db, admin, job_id, act)


def _changed(p: Platform, db: Session, user: User, job_id: str, act: Callable[[Job], Job]) -> dict:
    """``act`` on a job the user sees, under the state lock, committed; the job as the API shows it."""
    with p.state_lock:
        job = act(jobs.visible(db, user, job_id))
        db.commit()
    return jobs.view(job, tenancy.username(db, job.user_id), positions=p.queue_positions)


@router.get("/{job_id}/logs")
def logs(
    job_id: str,
    rank: int | None = Query(None, ge=0, le=DB_INT_MAX),
    follow: bool = False,
    offset: Offset = 0,  # bytes to skip; past the end gives nothing
    user: User = Depends(current_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
) -> StreamingResponse:
    """Plain bytes of one rank's log. With follow, the response stays open until the job ends; a job that has not
    started yet is waited for."""
    job = jobs.visible(db, user, job_id)
    if not follow and not job.handle and job.attempt == 0:
        raise HTTPException(409, f"job {job_id} has not started; it is {job.state}")
    _check_rank(job, rank)
    job_id, attempt, handle, runtime = job.id, job.attempt, job.handle, job.runtime
    offset = min(offset, _MAX_LOG_OFFSET)
    if handle:
        p.runtime_of(runtime, handle)  # a runtime that cannot start here: a 502 with its reason, before any byte

    def stream() -> Iterator[bytes]:
        nonlocal attempt, handle, runtime
        if follow:
            while not handle:  # wait for the launch (or the end, if it never starts)
                time.sleep(0.5)
                with p.session() as s:
                    j = s.get(Job, job_id)
                    if j is None or JobState(j.state).terminal and not j.handle:
                        return
                    attempt, handle, runtime = j.attempt, j.handle, j.runtime
        # read by the runtime that wrote it: the same bytes before and after a restart that changed the default
        yield from p.runtime_of(runtime, handle).logs(
            Handle(job_id, attempt, handle or {}), rank=rank, follow=follow, offset=offset
        )

    return StreamingResponse(stream(), media_type="text/plain; charset=utf-8")


@router.get("/{job_id}/stream")
def stream(
    job_id: str,
    rank: int | None = Query(None, ge=0, le=DB_INT_MAX),
    last_event_id: str | None = Header(None, max_length=64),
    user: User = Depends(current_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
) -> StreamingResponse:
    """Server-sent events: the job's state as it changes and one rank's log as it grows, until the job has ended
    (see ``caldera.server.log_stream``). A reconnect with ``Last-Event-ID`` resumes the log where it stopped."""
    job = jobs.visible(db, user, job_id)
    _check_rank(job, rank)
    job_id = job.id

    def read() -> Progress | None:
        with p.session() as s:
            j = s.get(Job, job_id)
            if j is None:
                return None
            fields = {"state": j.state, "attempt": j.attempt, "exit_code": j.exit_code, "message": j.message}
            return Progress(fields, JobState(j.state).terminal, j.attempt, bool(j.handle), (j.runtime, j.handle))

    def read_log(now: Progress, offset: int) -> Iterator[bytes]:
        runtime, handle = now.source
        return p.runtime_of(runtime, handle).logs(Handle(job_id, now.attempt, handle), rank=rank, offset=offset)

    return sse_response(live_events(read, read_log, parse_resume(last_event_id)))
