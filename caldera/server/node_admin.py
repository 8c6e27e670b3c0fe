"""The admin routes that cordon, drain and uncordon nodes (see ``cordons``)."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field
from sqlalchemy.orm import Session

from caldera.db.models import NodeCordon, User
from caldera.server import audit
from caldera.server.cordons import cordon, drain, known_node, mirror, view
from caldera.server.deps import admin_user, db_session, platform
from caldera.server.platform import Platform

router = APIRouter(prefix="/api/v1/admin/nodes", tags=["admin"])


class CordonIn(BaseModel):
    reason: str = Field("", max_length=1024)


@router.post("/{name}/cordon")
def cordon_node(
    name: str,
    body: CordonIn,
    admin: User = Depends(admin_user),
    p: Platform = Depends(platform),
    db=Depends(db_session),
) -> dict:
    row = cordon(p, db, admin, name, body.reason)
    audit.record(db, admin, "cordon-node", name, {"reason": body.reason})
    db.commit()
    return {"node": name, "cordon": view(row)}


@router.post("/{name}/drain")
def drain_node(
    name: str,
    body: CordonIn,
    admin: User = Depends(admin_user),
    p: Platform = Depends(platform),
    db=Depends(db_session),
) -> dict:
    victims = drain(p, db, admin, name, body.reason)
    audit.record(db, admin, "drain-node", name, {"reason": body.reason, "preempted": victims})
    db.commit()
    return {"node": name, "cordon": view(db.get(NodeCordon, name)), "preempted": victims}


@router.post("/{name}/uncordon")
def uncordon_node(
    name: str, admin: User = Depends(admin_user), p: Platform = Depends(platform), db: Session = Depends(db_session)
) -> dict:
    row = db.get(NodeCordon, known_node(p, name))
    mirror(p, name, schedulable=True)
    if row is not None:
        db.delete(row)
    audit.record(db, admin, "uncordon-node", name)
    db.commit()
    return {"node": name, "cordon": None}
