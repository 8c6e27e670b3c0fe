"""Job templates: a job body saved under a name (checked by the spec's rules), its owner's to change, and shared
read-only with the members of one account. Others' templates do not exist for a user (404), as others' jobs."""

from __future__ import annotations

import json
import time
from typing import Any

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field
from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from caldera.core.spec import parse_spec
from caldera.core.tenancy import Role
from caldera.db.models import JobTemplate, User
from caldera.server import tenancy
from caldera.server.deps import current_user, db_session
from caldera.server.errors import Conflict, Invalid, NotFound
from caldera.server.params import RowId

router = APIRouter(prefix="/api/v1/templates", tags=["templates"])
MAX_TEMPLATES_PER_USER = 200
MAX_SPEC_BYTES = 262144  # a template is read on every form that starts from it; a spec's own limits allow more
_NAME = r"^[A-Za-z0-9][A-Za-z0-9._ -]{0,127}$"


class TemplateIn(BaseModel):
    name: str = Field(..., min_length=1, max_length=128, pattern=_NAME)
    description: str = Field("", max_length=4096)
    spec: dict[str, Any] = Field(..., description="a job body as POST /api/v1/jobs takes it")
    shared_account: str | None = Field(None, max_length=64, description="members of this account may use it")


class ShareIn(BaseModel):
    account: str | None = Field(None, max_length=64, description="share with this account; null: private again")


def view(t: JobTemplate, owner: str | None) -> dict[str, Any]:
    return {
        "id": t.id,
        "name": t.name,
        "description": t.description,
        "owner": owner,
        "kind": t.kind,
        "spec": t.spec,
        "shared_account": t.shared_account,
        "created_at": t.created_at,
        "updated_at": t.updated_at,
    }


def _owner_name(db: Session, t: JobTemplate) -> str | None:
    return db.scalar(select(User.username).where(User.id == t.owner_id))


def visible(db: Session, user: User, template_id: int) -> JobTemplate:
    """Mine, shared with one of my accounts, or any for an admin; otherwise it does not exist."""
    t = db.get(JobTemplate, template_id)
    if t is None or not (
        t.owner_id == user.id
        or user.role == Role.ADMIN.value
        or (t.shared_account is not None and tenancy.is_member(db, user, t.shared_account))
    ):
        raise NotFound(f"no template {template_id}")
    return t


def _owned(db: Session, user: User, template_id: int) -> JobTemplate:
    """Only the owner (or an admin) changes a template; members it is shared with get the same 404 as strangers."""
    t = visible(db, user, template_id)
    if t.owner_id != user.id and user.role != Role.ADMIN.value:
        raise NotFound(f"no template {template_id}")
    return t


def _check_share(db: Session, user: User, account: str | None) -> None:
    if account is None:
        return
    try:
        tenancy.get_account(db, account)
    except NotFound:
        raise Invalid("shared_account", f"unknown account {account!r}") from None
    if user.role != Role.ADMIN.value and not tenancy.is_member(db, user, account):
        raise Invalid("shared_account", f"you are not a member of account {account!r}")


def save(db: Session, user: User, body: TemplateIn) -> JobTemplate:
    """Create, or replace my template of the same name. The spec must be one the API would accept as a job body
    (its rules, not the cluster's: a queue or cap may change before the template is used)."""
    spec = parse_spec(body.spec).model_dump(mode="json", exclude_none=True)
    if len(json.dumps(spec)) > MAX_SPEC_BYTES:
        raise Invalid("spec", f"at most {MAX_SPEC_BYTES} bytes as JSON")
    _check_share(db, user, body.shared_account)
    now = time.time()
    t = db.scalar(select(JobTemplate).where(JobTemplate.owner_id == user.id, JobTemplate.name == body.name))
    if t is None:
        count = db.scalar(select(func.count()).select_from(JobTemplate).where(JobTemplate.owner_id == user.id))
        if count >= MAX_TEMPLATES_PER_USER:
            raise Conflict(f"you have {count} templates, the most one may keep; delete some first")
        t = JobTemplate(owner_id=user.id, name=body.name, created_at=now)
        db.add(t)
    t.description, t.kind, t.spec, t.shared_account, t.updated_at = (
        body.description, spec["kind"], spec, body.shared_account, now
    )  # fmt: skip
    db.flush()
    return t


def usable(db: Session, user: User) -> list[JobTemplate]:
    """Mine and those shared with my accounts (an admin's list is the same: theirs and shared, not everyone's)."""
    accounts = tenancy.user_accounts(db, user)
    q = select(JobTemplate).where(or_(JobTemplate.owner_id == user.id, JobTemplate.shared_account.in_(accounts)))
    return list(db.scalars(q.order_by(JobTemplate.name, JobTemplate.id)))


@router.get("")
def list_templates(user: User = Depends(current_user), db: Session = Depends(db_session)) -> list[dict]:
    names = tenancy.usernames(db)
    return [view(t, names.get(t.owner_id)) for t in usable(db, user)]


@router.post("", status_code=201)
def create_template(body: TemplateIn, user: User = Depends(current_user), db: Session = Depends(db_session)) -> dict:
    t = save(db, user, body)
    db.commit()
    return view(t, user.username)


@router.get("/{template_id}")
def get_template(template_id: RowId, user: User = Depends(current_user), db: Session = Depends(db_session)) -> dict:
    t = visible(db, user, template_id)
    return view(t, _owner_name(db, t))


@router.put("/{template_id}/share")
def share_template(
    template_id: RowId, body: ShareIn, user: User = Depends(current_user), db: Session = Depends(db_session)
) -> dict:
    t = _owned(db, user, template_id)
    _check_share(db, user, body.account)
    t.shared_account, t.updated_at = body.account, time.time()
    db.commit()
    return view(t, _owner_name(db, t))


@router.delete("/{template_id}")
def delete_template(template_id: RowId, user: User = Depends(current_user), db: Session = Depends(db_session)) -> dict:
    t = _owned(db, user, template_id)
    db.delete(t)
    db.commit()
    return {"id": template_id, "deleted": True}
