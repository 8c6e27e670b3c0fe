"""Job arrays: submit one spec as N tasks, list arrays with their tasks' states, cancel, hold or release them
whole. A single task is a job: the job routes act on it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session

from caldera.core.arrays import MAX_ARRAY_EXPRESSION_CHARS
from caldera.core.spec import JobSpec
from caldera.db.models import JobArray, User
from caldera.server import arrays, jobs, tenancy
from caldera.server.api_jobs import HoldIn
from caldera.server.deps import current_user, db_session, platform
from caldera.server.platform import Platform

router = APIRouter(prefix="/api/v1/arrays", tags=["jobs"])


class ArrayIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    spec: JobSpec
    array: str = Field(
        ...,
        min_length=1,
        max_length=MAX_ARRAY_EXPRESSION_CHARS,
        description="task indices as Slurm's --array: 0-99, 1,3,5, 0-20:5; %N: at most N running at once",
    )


def _views(db: Session, listed: list[JobArray]) -> list[dict]:
    """Arrays as a list shows them: their tasks counted per state, not each task (an array may have thousands)."""
    names = tenancy.usernames(db)
    ids = [a.id for a in listed]
    counts, firsts = arrays.counts_of(db, ids), arrays.firsts_of(db, ids)
    return [arrays.view(a, counts[a.id], names.get(a.user_id), firsts.get(a.id)) for a in listed]


def _whole(db: Session, array: JobArray) -> dict:
    """One array with each of its tasks."""
    listed = arrays.tasks(db, array)
    counts = dict(Counter(job.state for job in listed))
    first = listed[0] if listed else None
    return arrays.view(array, counts, tenancy.username(db, array.user_id), first, listed)


@router.post("", status_code=201)
def submit(
    body: ArrayIn,
    user: User = Depends(current_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
) -> dict:
    with p.state_lock:
        array = arrays.submit(p, db, user, body.spec, body.array)
        db.commit()
    return _whole(db, array)


@router.get("")
def list_arrays(
    all: bool = False,
    limit: int = Query(200, ge=1, le=5000),
    user: User = Depends(current_user),
    db: Session = Depends(db_session),
) -> list[dict]:
    """Newest first: yours, or with ``all`` (admins) everyone's."""
    return _views(db, arrays.list_arrays(db, user, all, limit))


@router.get("/{array_id}")
def describe(array_id: str, user: User = Depends(current_user), db: Session = Depends(db_session)) -> dict:
    return _whole(db, jobs.visible_array(db, user, array_id))


@router.post("/{array_id}/cancel")
def cancel(
    array_id: str,
    user: User = Depends(current_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
) -> dict:
    """Every task that has not ended: queued ones at once, running ones as ``cancel`` a job."""
    return _changed(p, db, user, array_id, lambda a: arrays.cancel(p, db, a, user))


@router.post("/{array_id}/hold")
def hold(
    array_id: str,
    body: HoldIn | None = None,
    user: User = Depends(current_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
) -> dict:
    """Every waiting task, as ``hold`` a job."""
    return _changed(p, db, user, array_id, lambda a: arrays.hold(db, a, user, body.reason if body else ""))


@router.post("/{array_id}/release")
def release(
    array_id: str,
    user: User = Depends(current_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
) -> dict:
    return _changed(p, db, user, array_id, lambda a: arrays.release(db, a, user))


def _changed(p: Platform, db: Session, user: User, array_id: str, act: Callable[[JobArray], None]) -> dict:
    """``act`` on an array the user sees, under the state lock, committed; the array as the API shows it."""
    with p.state_lock:
        array = jobs.visible_array(db, user, array_id)
        act(array)
        db.commit()
    return _whole(db, array)
