"""Nodes an admin takes out of scheduling: cordon (no new placements), drain (cordon, and preempt what runs there
with the usual notice, so it is re-queued), uncordon. Stored in the database; the scheduler sees a cordoned node as
unschedulable through the snapshot (``in_service``) and names it in its "why". The routes are in ``node_admin``."""

from __future__ import annotations

import dataclasses
import time

from sqlalchemy import select
from sqlalchemy.orm import Session

from caldera.core.cluster import Node
from caldera.core.states import JobState
from caldera.db.models import Job, NodeCordon, User
from caldera.runtime.base import Handle, nodes_of
from caldera.server.errors import NotFound, Unavailable
from caldera.server.jobs import request_preemption
from caldera.server.platform import Platform

RUNNING = (JobState.STARTING.value, JobState.RUNNING.value)


def by_node(db: Session) -> dict[str, NodeCordon]:
    return {c.node: c for c in db.scalars(select(NodeCordon))}


def in_service(db: Session, nodes: list[Node]) -> list[Node]:
    """The nodes as the scheduler should see them: a cordoned one is not schedulable."""
    out = by_node(db)
    return [dataclasses.replace(n, schedulable=False) if n.name in out else n for n in nodes]


def known_node(p: Platform, name: str) -> str:
    if name not in {n.name for n in p.nodes()}:
        raise NotFound(f"no node {name!r}")
    return name


def mirror(p: Platform, name: str, schedulable: bool) -> None:
    """A runtime whose cluster places jobs itself (Kubernetes) cordons the node there too, so its scheduler
    keeps new pods off it."""
    set_schedulable = getattr(p.runtime, "set_schedulable", None)
    if set_schedulable is None:
        return
    try:
        set_schedulable(name, schedulable)
    except Exception as exc:  # the change is not made in Caldera either: the admin retries
        raise Unavailable(f"the cluster did not {'uncordon' if schedulable else 'cordon'} node {name}: {exc}") from exc


def cordon(p: Platform, db: Session, admin: User, name: str, reason: str, drained: bool = False) -> NodeCordon:
    mirror(p, known_node(p, name), schedulable=False)
    row = db.get(NodeCordon, name) or NodeCordon(node=name)
    row.reason, row.by, row.at, row.drained = reason, admin.username, time.time(), drained
    db.add(row)
    return row


def drain(p: Platform, db: Session, admin: User, name: str, reason: str) -> list[str]:
    """Cordon, then preempt every job with a replica on the node (where the runtime says it runs: on Kubernetes
    the pods' node, not Caldera's allocation); returns their ids."""
    cordon(p, db, admin, name, reason, drained=True)
    why = f"node {name} is drained by an admin" + (f": {reason}" if reason else "")
    victims = []
    now = time.time()
    with p.state_lock:  # the loop and the API change job state under this lock
        for job in db.scalars(select(Job).where(Job.state.in_(RUNNING))):
            if job.stop_requested is None and name in _job_nodes(p, job):
                request_preemption(p, db, job, None, "NodeDrained", why, now, {"node": name, "note": reason})
                victims.append(job.id)
    return victims


def _job_nodes(p: Platform, job: Job) -> set[str]:
    runtime = p.runtime_of(job.runtime, job.handle)
    return nodes_of(runtime, Handle(job.id, job.attempt, job.handle or {}), (a["node"] for a in job.allocations))


def view(row: NodeCordon | None) -> dict | None:
    if row is None:
        return None
    return {"reason": row.reason, "by": row.by, "at": row.at, "drained": row.drained}
