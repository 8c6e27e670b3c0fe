"""The way into a lab from the platform's origin: check the platform login, then hand the browser to that lab's
own origin with a one-use ticket for that job. No lab content is ever served on this origin."""

from __future__ import annotations

from urllib.parse import quote, urlencode

from fastapi import APIRouter, Depends, Request
from fastapi.responses import RedirectResponse
from sqlalchemy.orm import Session

from caldera.server import jobs
from caldera.server.deps import db_session, platform, presented_token, user_for_token
from caldera.server.lab_proxy import lab_home
from caldera.server.platform import Platform
from caldera.server.security import LAB_TICKET, issue_lab

router = APIRouter(include_in_schema=False)
_TICKET_TTL_S = 60


@router.get("/jobs/{job_id}/lab/{path:path}")
def enter_lab(
    job_id: str, path: str, request: Request, p: Platform = Depends(platform), db: Session = Depends(db_session)
) -> RedirectResponse:
    here = quote(request.url.path) + (f"?{request.url.query}" if request.url.query else "")
    token = presented_token(request)
    if not token:
        return RedirectResponse(f"/login?{urlencode({'next': here})}", status_code=303)
    user = user_for_token(p, db, token)
    job = jobs.visible(db, user, job_id)
    ticket = issue_lab(p.keys, LAB_TICKET, user.id, job_id, _TICKET_TTL_S)
    target = lab_home(job.id, job.kind) + quote(path) + (f"?{request.url.query}" if request.url.query else "")
    entry = f"{p.settings.lab_url(job_id)}/_caldera/lab-login?{urlencode({'ticket': ticket, 'next': target})}"
    return RedirectResponse(entry, status_code=303)
