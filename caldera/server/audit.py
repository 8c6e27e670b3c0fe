"""The audit log of admin actions: one ``record`` call per admin route (in the same transaction as the change, so
a refused change leaves no entry), read newest first by admins."""

from __future__ import annotations

import json
import time
from typing import Any

from fastapi import APIRouter, Depends, Query
from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

from caldera.db.models import AdminAudit, User
from caldera.server.deps import admin_user, db_session

router = APIRouter(prefix="/api/v1/audit", tags=["admin"])
MAX_DETAIL_CHARS = 4096  # a queue's whole config fits; what does not is cut, the entry is still written


def record(db: Session, actor: User, action: str, target: str, detail: dict[str, Any] | None = None) -> None:
    """Callers pass no secrets (a password reset records who, not what)."""
    detail = detail or {}
    text = json.dumps(detail, default=str)
    if len(text) > MAX_DETAIL_CHARS:
        detail = {"truncated": text[:MAX_DETAIL_CHARS]}
    db.add(AdminAudit(at=time.time(), actor=actor.username, action=action[:64], target=target[:256], detail=detail))


def view(e: AdminAudit) -> dict[str, Any]:
    return {"id": e.id, "at": e.at, "actor": e.actor, "action": e.action, "target": e.target, "detail": e.detail}


def query(actor: str = "", action: str = "", target: str = "") -> Select:
    """Entries of one admin, one action and targets that contain ``target`` when given; unordered."""
    where = []
    if actor:
        where.append(AdminAudit.actor == actor)
    if action:
        where.append(AdminAudit.action == action)
    if target:
        where.append(AdminAudit.target.contains(target, autoescape=True))
    return select(AdminAudit).where(*where)


def entries(
    db: Session, offset: int, limit: int, actor: str = "", action: str = "", target: str = ""
) -> tuple[list[AdminAudit], int]:
    """A page of entries, newest first, and how many there are."""
    q = query(actor, action, target)
    total = db.scalar(select(func.count()).select_from(q.subquery())) or 0
    rows = db.scalars(q.order_by(AdminAudit.id.desc()).offset(offset).limit(limit))
    return list(rows), total


def actions(db: Session) -> list[str]:
    """Every action the log holds, for the filter's choices."""
    return list(db.scalars(select(AdminAudit.action).distinct().order_by(AdminAudit.action)))


@router.get("")
def audit_log(
    offset: int = Query(0, ge=0, le=10_000_000),
    limit: int = Query(50, ge=1, le=500),
    actor: str = Query("", max_length=64),
    action: str = Query("", max_length=64),
    target: str = Query("", max_length=256),
    _: User = Depends(admin_user),
    db: Session = Depends(db_session),
) -> dict:
    rows, total = entries(db, offset, limit, actor, action, target)
    return {"total": total, "offset": offset, "entries": [view(e) for e in rows]}
