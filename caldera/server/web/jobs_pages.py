"""Home (my jobs, my queues, free GPUs), the new-job forms, a job's page."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import RedirectResponse
from sqlalchemy.orm import Session

from caldera.core.spec import SpecError, parse_spec
from caldera.core.states import JobState
from caldera.db.models import User
from caldera.server import api_jobs, jobs
from caldera.server.deps import db_session, platform
from caldera.server.errors import CalderaError, NotFound
from caldera.server.platform import Platform
from caldera.server.web import job_forms, overview
from caldera.server.web.render import page
from caldera.server.web.session import PageNotFound, page_user

router = APIRouter(include_in_schema=False)
HOME_JOBS = 100


def _my_jobs(db: Session, user: User) -> list:
    return jobs.list_jobs(db, user, limit=HOME_JOBS)


@router.get("/")
def home(request: Request, user: User = Depends(page_user), p: Platform = Depends(platform), db=Depends(db_session)):
    nodes = overview.nodes_now(p, db, user)
    queues = [{**q, "largest_now": overview.largest_now(nodes, q)} for q in overview.my_queues(db, user)]
    return page(request, "home.html", user=user, jobs=_my_jobs(db, user), queues=queues, gpus=overview.free_gpus(nodes))


@router.get("/partials/my-jobs")
def my_jobs_rows(request: Request, user: User = Depends(page_user), db: Session = Depends(db_session)):
    """The home page's table body, refreshed in place by HTMX."""
    return page(request, "_job_rows.html", jobs=_my_jobs(db, user))


def _form_page(request: Request, p: Platform, db: Session, user: User, kind: str, form, errors, status=200):
    if kind not in job_forms.KINDS:
        raise PageNotFound()
    choices = overview.queue_choices(p, overview.my_queues(db, user))
    return page(
        request,
        "new_job.html",
        status=status,
        user=user,
        kind=kind,
        kinds=job_forms.KINDS,
        form=form,
        errors=errors,
        choices=choices,
        models=sorted({m for c in choices for m in c.models}),
        max_gpu=max((c.max_gpu for c in choices), default=0),
        priorities=job_forms.PRIORITIES,
    )


@router.get("/new/{kind}")
def new_job(
    request: Request, kind: str, clone: str = "", user=Depends(page_user), p=Depends(platform), db=Depends(db_session)
):
    """An empty form, or with ?clone=<job id> one filled from a job the user may see."""
    form = job_forms.form_of(_visible(db, user, clone).spec) if clone else job_forms.JobForm()
    return _form_page(request, p, db, user, kind, form, {})


@router.post("/new/{kind}")
def submit_job(
    request: Request,
    kind: str,
    form: Annotated[job_forms.JobForm, Form()],
    user: User = Depends(page_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
):
    choices = overview.queue_choices(p, overview.my_queues(db, user))
    body, errors = job_forms.body_of(kind, form, choices)
    if not errors:
        try:
            created = api_jobs.submit(spec=parse_spec(body), user=user, p=p, db=db)  # the API's own rules
            return RedirectResponse(f"/jobs/{created['id']}", 303)
        except SpecError as exc:
            errors = exc.errors
        except CalderaError as exc:
            errors = getattr(exc, "errors", None) or [{"field": "", "reason": exc.message}]
        db.rollback()
    return _form_page(request, p, db, user, kind, form, job_forms.by_field(errors), status=400)


def _visible(db: Session, user: User, job_id: str):
    try:
        return jobs.visible(db, user, job_id[:64])
    except NotFound:
        raise PageNotFound() from None


def _status(db: Session, job) -> dict:
    return {"job": job, "events": jobs.events(db, job), "terminal": JobState(job.state).terminal}


@router.get("/jobs/{job_id}")
def job_page(request: Request, job_id: str, user: User = Depends(page_user), db: Session = Depends(db_session)):
    job = _visible(db, user, job_id)
    ranks = job.spec.get("replicas", 1) * job.spec.get("procs_per_replica", 1)
    return page(request, "job.html", user=user, ranks=ranks, **_status(db, job))


@router.get("/jobs/{job_id}/partials/status")
def job_status(request: Request, job_id: str, user: User = Depends(page_user), db: Session = Depends(db_session)):
    """State, why pending and the events, refreshed in place by HTMX."""
    return page(request, "_job_status.html", **_status(db, _visible(db, user, job_id)))


@router.post("/jobs/{job_id}/cancel")
def cancel_job(job_id: str, user: User = Depends(page_user), p=Depends(platform), db: Session = Depends(db_session)):
    _visible(db, user, job_id)
    api_jobs.cancel(job_id=job_id, user=user, p=p, db=db)
    return RedirectResponse(f"/jobs/{job_id}", 303)
