"""Publishing a succeeded job's output from its page by hand: a folder of its workspace becomes a model version
that records the job, through the API's own publish (``from_job``) and its rules; a refusal comes back on the
job's page, in the reader's language. (A spec's ``publish`` does the same by itself as the job ends.)"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import RedirectResponse
from sqlalchemy.orm import Session

from caldera.core import catalogue_names as names
from caldera.db.models import User
from caldera.server import api_catalogue
from caldera.server.deps import db_session, platform
from caldera.server.platform import Platform
from caldera.server.web import api_call
from caldera.server.web.file_pages import page_caller
from caldera.server.web.jobs_pages import job_page_with_errors, visible_job
from caldera.server.web.session import page_user
from caldera.storage.paths import MAX_PATH_CHARS

router = APIRouter(include_in_schema=False)


@router.post("/jobs/{job_id}/publish")
def publish_output(
    request: Request,
    job_id: str,
    name: str = Form(..., max_length=64),
    version: str = Form(..., max_length=32),
    path: str = Form("", max_length=MAX_PATH_CHARS),
    visibility: str = Form("private", max_length=16),
    description: str = Form("", max_length=names.MAX_DESCRIPTION_CHARS),
    user: User = Depends(page_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
):
    job = visible_job(db, user, job_id)

    def publish() -> dict:
        body = api_catalogue.PublishIn(kind="model", name=name.strip(), version=version.strip(), path=path,
                                       visibility=visibility, description=description, from_job=job.id)  # fmt: skip
        return api_catalogue.publish(body, page_caller(request, user, db), p)

    published, errors = api_call.call(db, publish)
    if published:
        return RedirectResponse(f"/data?kind=model&q={published['name']}", 303)
    return job_page_with_errors(request, p, db, user, job_id, errors)
