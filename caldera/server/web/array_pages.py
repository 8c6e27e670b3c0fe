"""A job array's page: its tasks counted by state and listed a page at a time, and cancel, hold and release of the
whole array, by the API's own routes and checks."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import RedirectResponse
from sqlalchemy import select
from sqlalchemy.orm import Session

from caldera.core.states import JobState
from caldera.db.models import Job, User
from caldera.server import api_arrays, arrays, jobs
from caldera.server.deps import db_session, platform
from caldera.server.errors import NotFound
from caldera.server.platform import Platform
from caldera.server.web import listing
from caldera.server.web.render import page
from caldera.server.web.session import PageNotFound, page_user

router = APIRouter(include_in_schema=False)
TASK_SORTS = {"index": Job.array_index, "state": Job.state}
_ACTIONS = {"cancel": api_arrays.cancel, "hold": api_arrays.hold, "release": api_arrays.release}


def _visible(db: Session, user: User, array_id: str):
    try:
        return jobs.visible_array(db, user, array_id[:64])
    except NotFound:
        raise PageNotFound() from None


@router.get("/arrays/{array_id}")
def array_page(request: Request, array_id: str, user: User = Depends(page_user), db: Session = Depends(db_session)):
    array = _visible(db, user, array_id)
    want = listing.parse(request, TASK_SORTS, "index", ("state",))
    tasks = select(Job).where(Job.array_id == array.id)
    if want.filters["state"]:
        tasks = tasks.where(Job.state == want.filters["state"])
    shown, want = listing.fetch(db, tasks, want, TASK_SORTS, Job.id)
    counts = arrays.counts_of(db, [array.id])[array.id]
    state = arrays.state_of(counts)
    return page(
        request, "array.html", user=user, array=array, tasks=shown, counts=counts, state=state, listing=want,
        states=sorted(counts), ended=JobState(state).terminal, latest=jobs.current_events(db, shown),
    )  # fmt: skip


@router.post("/arrays/{array_id}/{action}")
def act(
    array_id: str,
    action: str,
    user: User = Depends(page_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
):
    """Cancel, hold or release every task that may be, as the API does; back to the array's page."""
    array = _visible(db, user, array_id)
    if action not in _ACTIONS:
        raise PageNotFound()
    _ACTIONS[action](array_id=array.id, user=user, p=p, db=db)
    return RedirectResponse(f"/arrays/{array.id}", 303)
