"""Governance over HTTP: extend and lock requests and their decisions, account admins, and what governance knows
of a job (docs/governance.md)."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from caldera.db.models import Job, JobGovernance, Membership, User
from caldera.errors import NotFound
from caldera.governance import requests as rules
from caldera.server import approvals, audit, jobs, tenancy
from caldera.server.deps import admin_user, current_user, db_session, platform
from caldera.server.params import RowId
from caldera.server.platform import Platform

router = APIRouter(prefix="/api/v1", tags=["governance"])


class RequestIn(BaseModel):
    kind: Literal["extend", "lock"]
    seconds: int = Field(..., ge=60, le=rules.MAX_SECONDS, description="how much longer, or how long locked")
    reason: str = Field(..., min_length=1, max_length=rules.MAX_REASON_CHARS)


class DecisionIn(BaseModel):
    approve: bool
    note: str = Field("", max_length=rules.MAX_REASON_CHARS)


class AccountAdminIn(BaseModel):
    admin: bool


@router.post("/jobs/{job_id}/requests", status_code=201)
def ask(
    job_id: str,
    body: RequestIn,
    user: User = Depends(current_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
) -> dict:
    """Ask to extend my job's runtime limit or to lock it against idle stopping."""
    job = jobs.visible(db, user, job_id)
    req = approvals.ask(p, db, user, job, body.kind, body.seconds, body.reason)
    db.commit()
    return approvals.view(req, job, user.username)


@router.get("/requests")
def list_requests(
    state: list[Literal["pending", "approved", "declined", "expired"]] | None = Query(None),
    limit: int = Query(200, ge=1, le=1000),
    user: User = Depends(current_user),
    db: Session = Depends(db_session),
) -> list[dict]:
    """My requests, and those I may decide (an account admin: its members'; an admin: all)."""
    names = tenancy.usernames(db)
    return [approvals.view(r, j, names.get(r.user_id)) for r, j in rules.visible_requests(db, user, state, limit)]


@router.post("/requests/{request_id}/decision")
def decide(
    request_id: RowId,
    body: DecisionIn,
    user: User = Depends(current_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
) -> dict:
    req = approvals.decide(p, db, user, request_id, body.approve, body.note)
    db.commit()
    return approvals.view(req, db.get(Job, req.job_id), tenancy.username(db, req.user_id))


@router.get("/jobs/{job_id}/governance")
def job_governance(job_id: str, user: User = Depends(current_user), db: Session = Depends(db_session)) -> dict:
    """What governance recorded about my job: idle warning, flag, lock, extensions."""
    job = jobs.visible(db, user, job_id)
    gov = db.get(JobGovernance, job.id)
    keys = ("idle_warned_at", "idle_flagged_at", "limit_warned_at", "locked_until", "extended_s", "snapshot_image")
    return {"job": job.id, **{k: getattr(gov, k) if gov else None for k in keys}}


@router.put("/accounts/{name}/admins/{username}")
def set_account_admin(
    name: str,
    username: str,
    body: AccountAdminIn,
    admin: User = Depends(admin_user),
    db: Session = Depends(db_session),
) -> dict:
    """Make a member of an account its admin (who decides its members' requests), or no longer."""
    account, who = tenancy.get_account(db, name), tenancy.get_user(db, username)
    row = db.scalar(select(Membership).where(Membership.account_id == account.id, Membership.user_id == who.id))
    if row is None:
        raise NotFound(f"{username} is not a member of {name}")
    row.admin = body.admin
    audit.record(db, admin, "account.admin", f"{name}/{username}", {"admin": body.admin})
    db.commit()
    return {"account": name, "user": username, "admin": body.admin}
