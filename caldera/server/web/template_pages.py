"""Job templates: save the new-job form as one, list mine and those shared with my accounts, share, delete. Every
rule is the API's (caldera/server/api_templates.py)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import RedirectResponse
from sqlalchemy.orm import Session

from caldera.db.models import User
from caldera.server import api_templates, tenancy
from caldera.server.deps import db_session, platform
from caldera.server.errors import NotFound
from caldera.server.params import RowId
from caldera.server.platform import Platform
from caldera.server.web import api_call, job_forms, jobs_pages
from caldera.server.web.render import page
from caldera.server.web.session import PageNotFound, page_user

router = APIRouter(include_in_schema=False)


def _templates_page(request: Request, user: User, db: Session, errors=(), status=200):
    return page(
        request, "templates.html", status=status, user=user, errors=list(errors),
        templates=api_templates.list_templates(user=user, db=db), accounts=tenancy.user_accounts(db, user),
    )  # fmt: skip


@router.get("/templates")
def templates(request: Request, user: User = Depends(page_user), db: Session = Depends(db_session)):
    return _templates_page(request, user, db)


@router.post("/new/{kind}/template")
def save_form_as_template(
    request: Request,
    kind: str,
    form: Annotated[job_forms.JobForm, Form()],
    user: User = Depends(page_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
):
    """The form as a template named after the job (the same name again replaces my template of that name)."""
    body, errors = jobs_pages.form_body(p, db, user, kind, form)
    if not errors:
        _, errors = api_call.call(
            db,
            lambda: api_templates.create_template(
                body=api_templates.TemplateIn(name=form.name, spec=body), user=user, db=db
            ),
        )
        if not errors:
            return RedirectResponse("/templates", 303)
    return jobs_pages.form_page(request, p, db, user, kind, form, job_forms.by_field(errors), status=400)


def _page_errors(fn, **kw):
    """Call an API function; a template that is not the user's is the page's 404."""
    try:
        fn(**kw)
    except NotFound:
        raise PageNotFound() from None


@router.post("/templates/{template_id}/share")
def share(
    request: Request,
    template_id: RowId,
    account: str = Form("", max_length=64),
    user: User = Depends(page_user),
    db: Session = Depends(db_session),
):
    body = api_templates.ShareIn(account=account or None)
    _, errors = api_call.call(
        db, _page_errors, api_templates.share_template, template_id=template_id, body=body, user=user, db=db
    )
    if errors:
        return _templates_page(request, user, db, errors, 400)
    return RedirectResponse("/templates", 303)


@router.post("/templates/{template_id}/delete")
def delete(template_id: RowId, user: User = Depends(page_user), db: Session = Depends(db_session)):
    _page_errors(api_templates.delete_template, template_id=template_id, user=user, db=db)
    return RedirectResponse("/templates", 303)
