"""Governance in the portal: the approvals page (my requests, and those I may decide), a job's governance box
(idle or runtime-limit warning, lock, extension, the request form) and the home page's notices. Forms call the
API's own route functions, with their permission checks."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import RedirectResponse
from sqlalchemy import select
from sqlalchemy.orm import Session

from caldera.core.states import JobState
from caldera.core.tenancy import Role
from caldera.db.models import GovernanceRequest, Image, Job, JobEventRow, JobGovernance, User
from caldera.governance import advice
from caldera.governance import requests as rules
from caldera.images import catalogue
from caldera.server import api_governance, tenancy
from caldera.server.deps import db_session, platform
from caldera.server.params import RowId
from caldera.server.platform import Platform
from caldera.server.web import api_call, job_forms, job_yaml
from caldera.server.web.render import page
from caldera.server.web.session import PageNotFound, page_user

router = APIRouter(include_in_schema=False)
# what a job's governance row says, and the event that said it in words
NOTICES = (
    ("idle_warned_at", "IdleWarning"),
    ("idle_flagged_at", "IdleFlagged"),
    ("limit_warned_at", "RuntimeLimitWarning"),
)
MAX_HOURS = rules.MAX_SECONDS // 3600


def notices(db: Session, jobs: list[Job]) -> list[tuple[Job, JobEventRow]]:
    """For running jobs governance warned or flagged: the job and the event that warned it, newest first."""
    running = {j.id: j for j in jobs if j.state == JobState.RUNNING.value}
    if not running:
        return []
    out = []
    for gov in db.scalars(select(JobGovernance).where(JobGovernance.job_id.in_(running))):
        for column, reason in NOTICES:
            if getattr(gov, column) is None:
                continue
            event = db.scalar(
                select(JobEventRow)
                .where(JobEventRow.job_id == gov.job_id, JobEventRow.reason == reason)
                .order_by(JobEventRow.id.desc())
            )
            if event is not None:
                out.append((running[gov.job_id], event))
    return sorted(out, key=lambda pair: -pair[1].at)


def advice_of(db: Session, jobs: list[Job]) -> list[tuple[Job, list[dict]]]:
    """Finished jobs that have right-sizing advice, as listed."""
    ids = [j.id for j in jobs if j.finished_at is not None]
    if not ids:
        return []
    rows = db.scalars(select(JobGovernance).where(JobGovernance.job_id.in_(ids), JobGovernance.advice.is_not(None)))
    found = {g.job_id: g.advice for g in rows if g.advice}
    return [(j, found[j.id]) for j in jobs if j.id in found]


def snapshot_to_resume(db: Session, job: Job) -> Image | None:
    """The image a session was saved as before governance stopped it for idleness, while that image is ready."""
    gov = db.get(JobGovernance, job.id)
    if job.reason != "IdleStopped" or gov is None or gov.snapshot_image is None:
        return None
    img = db.get(Image, gov.snapshot_image)
    return img if img is not None and img.state == "ready" else None


def job_context(db: Session, user: User, job: Job) -> dict:
    """The job page's governance box."""
    reqs = db.scalars(
        select(GovernanceRequest).where(GovernanceRequest.job_id == job.id).order_by(GovernanceRequest.id.desc())
    )
    return {
        "gov": db.get(JobGovernance, job.id),
        "gov_notices": notices(db, [job]),
        "gov_requests": list(reqs),
        "may_ask": job.user_id == user.id and job.state in ("Queued", "Starting", "Running"),
        "may_resume": job.user_id == user.id and snapshot_to_resume(db, job) is not None,
        "max_hours": MAX_HOURS,
    }


def _approvals(request: Request, db: Session, user: User, errors=(), status: int = 200):
    pairs = rules.visible_requests(db, user)
    names = tenancy.usernames(db)
    rows = [
        {"req": r, "job": j, "user": names.get(r.user_id), "may_decide": rules.may_decide(db, user, r, j)}
        for r, j in pairs
    ]
    idle = []  # admins: every running job governance warned or flagged, to act on from its page
    if user.role == Role.ADMIN.value:
        running = list(db.scalars(select(Job).where(Job.state == JobState.RUNNING.value)))
        idle = [(j, e, names.get(j.user_id)) for j, e in notices(db, running)]
    oversees = user.role == Role.ADMIN.value or bool(rules.admin_accounts(db, user))  # the low-utilisation list
    context = {"rows": rows, "idle": idle, "oversees": oversees, "errors": list(errors)}
    return page(request, "approvals.html", status=status, user=user, **context)


@router.get("/approvals")
def approvals_page(request: Request, user: User = Depends(page_user), db: Session = Depends(db_session)):
    return _approvals(request, db, user)


@router.post("/approvals/{request_id}")
def decide(
    request: Request,
    request_id: RowId,
    decision: str = Form(..., pattern="^(approve|decline)$"),
    note: str = Form("", max_length=rules.MAX_REASON_CHARS),
    user: User = Depends(page_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
):
    body = api_governance.DecisionIn(approve=decision == "approve", note=note)
    _, errors = api_call.call(db, api_governance.decide, request_id=request_id, body=body, user=user, p=p, db=db)
    if errors:
        return _approvals(request, db, user, errors, status=400)
    return RedirectResponse("/approvals", 303)


@router.post("/jobs/{job_id}/requests")
def ask(
    request: Request,
    job_id: str,
    kind: str = Form(..., max_length=16),
    hours: str = Form(..., max_length=8),
    reason: str = Form("", max_length=rules.MAX_REASON_CHARS),
    user: User = Depends(page_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
):
    """Ask to extend or lock my job; a refusal comes back on the job's page."""
    from caldera.server.web.jobs_pages import job_page_with_errors  # the job page imports this module

    def send() -> dict:
        seconds = round(float(hours) * 3600) if hours.strip().replace(".", "", 1).isdigit() else 0
        body = api_governance.RequestIn(kind=kind, seconds=seconds, reason=reason)
        return api_governance.ask(job_id=job_id[:64], body=body, user=user, p=p, db=db)

    _, errors = api_call.call(db, send)
    if errors:
        return job_page_with_errors(request, p, db, user, job_id, errors)
    return RedirectResponse(f"/jobs/{job_id[:64]}#governance", 303)


@router.post("/jobs/{job_id}/resubmit-advised")
def resubmit_advised(
    request: Request,
    job_id: str,
    user: User = Depends(page_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
):
    """A finished job of mine again, with its right-sizing advice applied; refused like a plain resubmit."""
    from caldera.server.web import jobs_pages  # the job page imports this module

    job = jobs_pages.visible_job(db, user, job_id)
    gov = db.get(JobGovernance, job.id)
    if job.user_id != user.id or not JobState(job.state).terminal or gov is None or not gov.advice:
        raise PageNotFound()
    return _submit_again(request, p, db, user, job, advice.applied(job_yaml.body_of_job(job), gov.advice))


@router.post("/jobs/{job_id}/resume-snapshot")
def resume_from_snapshot(
    request: Request,
    job_id: str,
    user: User = Depends(page_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
):
    """My session that governance stopped for idleness, again on the image it was saved as; refused like a plain
    resubmit (the image is resolved and checked as any job's)."""
    from caldera.server.web import jobs_pages  # the job page imports this module

    job = jobs_pages.visible_job(db, user, job_id)
    img = snapshot_to_resume(db, job)
    if job.user_id != user.id or img is None:
        raise PageNotFound()
    body = {**job_yaml.body_of_job(job), "image": catalogue.reference(p.settings, img)}
    return _submit_again(request, p, db, user, job, body)


def _submit_again(request: Request, p: Platform, db: Session, user: User, job: Job, body: dict):
    """The new job's page, or the form of ``body`` with the API's refusals."""
    from caldera.server.web import jobs_pages  # the job page imports this module

    new_id, errors = jobs_pages._submit(p, db, user, body)
    if new_id:
        return RedirectResponse(f"/jobs/{new_id}", 303)
    return jobs_pages.form_page(
        request, p, db, user, job.kind, job_forms.form_of(body), job_forms.by_field(errors), status=400
    )
