"""Extend and lock requests carried out (rules in caldera.governance.requests): each request, decision and expiry
is an event on the job, an entry in the audit log and a notification (approval_requested to those who may
decide, approval_decided to the requester)."""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy.orm import Session

from caldera.core.states import JobState
from caldera.db.models import GovernanceRequest, Job, User
from caldera.errors import Conflict, Forbidden, NotFound
from caldera.governance import requests as rules
from caldera.notify import events, outbox
from caldera.server import audit, cordons
from caldera.server.governor import state_of
from caldera.server.jobs import note
from caldera.server.notifications import duration, gettext_for, tell
from caldera.server.platform import Platform

ACTIVE = (JobState.STARTING.value, JobState.RUNNING.value)
ASKABLE = (JobState.QUEUED.value, *ACTIVE)


def _not_cordoned(p: Platform, db: Session, job: Job) -> None:
    """A job on a cordoned node is on its way off it: it cannot be locked there."""
    cordoned = cordons.by_node(db)
    node = next((a["node"] for a in job.allocations if a["node"] in cordoned), None)
    if node is not None:
        why = f"job {job.id} runs on node {node}, which is cordoned: it cannot be locked"
        raise Conflict(why, "CordonedNoLock", {"job": job.id, "node": node})


def ask(p: Platform, db: Session, user: User, job: Job, kind: str, seconds: int, reason: str) -> GovernanceRequest:
    """``job``: one the user may see; only its owner asks."""
    if job.user_id != user.id:
        raise Forbidden("only the job's owner asks to extend or lock it", "OnlyOwnerAsks")
    if job.state not in ASKABLE:
        why = f"job {job.id} is {job.state}: only a queued or running job can be extended or locked"
        raise Conflict(why, "NotAskable", {"job": job.id, "state": job.state})
    if kind == rules.LOCK:
        _not_cordoned(p, db, job)
    pending = db.query(GovernanceRequest).filter_by(job_id=job.id, kind=kind, state=rules.PENDING).first()
    if pending is not None:
        why = f"request {pending.id} to {kind} job {job.id} is still waiting for a decision"
        raise Conflict(why, "RequestPending", {"request": pending.id, "job": job.id})
    now = time.time()
    req = GovernanceRequest(
        job_id=job.id, user_id=user.id, kind=kind, seconds=seconds, reason=reason, state=rules.PENDING, created_at=now
    )
    db.add(req)
    db.flush()
    said = {"user": user.username, "duration": duration(seconds), "reason": reason}
    verb = "extend it by" if kind == rules.EXTEND else "lock it for"
    note(db, job, f"{kind.capitalize()}Requested", f"{user.username} asks to {verb} {said['duration']}: {reason}", said)
    audit.record(db, user, f"governance.{kind}.request", f"job {job.id}", {"request": req.id, "seconds": seconds})
    params = {"job": job.name, "requester": user.username, "action": kind, "reason": reason}
    for decider in rules.deciders(db, job):
        outbox.notify(db, decider.id, events.APPROVAL_REQUESTED, params, gettext_for, None, job.id, now)
    return req


def decide(
    p: Platform, db: Session, user: User, request_id: int, approve: bool, decision_note: str = ""
) -> GovernanceRequest:
    req = db.get(GovernanceRequest, request_id)
    job = db.get(Job, req.job_id) if req is not None else None
    if req is None or job is None or not (req.user_id == user.id or rules.may_decide(db, user, req, job)):
        raise NotFound(f"no request {request_id}")
    if not rules.may_decide(db, user, req, job):
        raise Forbidden("an admin of the job's account or a platform admin decides this request", "NotDecider")
    if req.state != rules.PENDING:
        raise Conflict(f"request {req.id} is already {req.state}", "AlreadyDecided", {"request": req.id})
    now = time.time()
    said: dict[str, Any] = {"by": user.username, "duration": duration(req.seconds)}
    if approve:
        if job.state not in ASKABLE:
            why = f"job {job.id} is {job.state}: only a queued or running job can be extended or locked"
            raise Conflict(why, "NotAskable", {"job": job.id, "state": job.state})
        if req.kind == rules.LOCK:
            _not_cordoned(p, db, job)
        gov = state_of(db, job.id)
        if req.kind == rules.EXTEND:
            gov.extended_s = (gov.extended_s or 0.0) + req.seconds
            gov.limit_warned_at = None  # warned again before the new limit
            message = f"extended by {said['duration']}, approved by {user.username}"
        else:
            gov.locked_until = max(gov.locked_until or now, now) + req.seconds
            message = f"locked against idle stopping for {said['duration']}, approved by {user.username}"
        req.state = rules.APPROVED
        note(db, job, f"{req.kind.capitalize()}Approved", message, said)
    else:
        req.state = rules.DECLINED
        said["note"] = decision_note
        what = "extension" if req.kind == rules.EXTEND else "lock"
        note(db, job, f"{req.kind.capitalize()}Declined", f"{user.username} declined the {what}", said)
    req.decided_by, req.decided_at, req.note = user.username, now, decision_note
    audit.record(db, user, "governance.decide", f"job {job.id}", {"request": req.id, "state": req.state})
    tell(db, job, events.APPROVAL_DECIDED, {"action": req.kind, "decision": req.state}, now)
    return req


def view(req: GovernanceRequest, job: Job, requester: str | None = None) -> dict[str, Any]:
    return {
        "id": req.id,
        "job": job.id,
        "job_name": job.name,
        "account": job.account,
        "user": requester,
        "kind": req.kind,
        "seconds": req.seconds,
        "reason": req.reason,
        "state": req.state,
        "created_at": req.created_at,
        "decided_by": req.decided_by,
        "decided_at": req.decided_at,
        "note": req.note,
    }
