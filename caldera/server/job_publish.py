"""A job's ``publish`` (caldera/core/spec.py): once the job has succeeded, a folder of its working directory becomes
a model version that records the job, through the API's own publish (``from_job``), so the rules and the copy are
the same as when its owner publishes it by hand.

The loop marks the job pending as it records the success, in the same commit, and wakes this thread: a copy may
take minutes and must not stall a scheduling cycle. Publishes run one at a time, each waiting for its copy (the
API's, caldera/server/catalogue_copies.py); the loop's start (a restart) wakes the thread too, so a job left pending
by a stopped server is published then (its version, if the server stopped while it was copied, copied again).
Its outcome is the job's (``publish_state``, ``publish_result``) and one of its events.
"""

from __future__ import annotations

import logging
import os
import posixpath
import threading
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from caldera.core.spec import Publish
from caldera.db.models import CatalogueEntry, Job, User
from caldera.errors import CalderaError
from caldera.server import api_catalogue, catalogue_copies, files
from caldera.server.api_files import Caller
from caldera.server.jobs import note
from caldera.server.platform import Platform
from caldera.storage.catalogue import COPYING, READY
from caldera.storage.catalogue import FAILED as COPY_FAILED
from caldera.storage.errors import NoSuchPath

log = logging.getLogger("caldera.publish")
PENDING, PUBLISHED, FAILED = "pending", "published", "failed"


def publish_of(job: Job) -> Publish | None:
    """The job's ``publish`` as stored (None: it asks for none)."""
    raw = (job.spec or {}).get("publish")
    return None if raw is None else Publish.model_validate(raw)


class Publisher:
    def __init__(self, platform: Platform):
        self.p = platform
        self._wake, self._stop = threading.Event(), threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def kick(self) -> None:
        """Publish every pending job, in the thread (started with the first kick)."""
        with self._lock:
            if self._stop.is_set():
                return
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="caldera-publish", daemon=True)
                self._thread.start()
        self._wake.set()

    def stop(self) -> None:
        with self._lock:
            self._stop.set()
            self._wake.set()
            thread = self._thread
        if thread is not None:
            thread.join(timeout=10)  # a copy under way ends with the process; the job stays pending for the next start

    def _run(self) -> None:
        while self._wake.wait() and not self._stop.is_set():
            self._wake.clear()
            try:
                self.publish_pending()
            except Exception:  # noqa: BLE001 - the jobs stay pending: the next kick or start tries again
                log.exception("publishing jobs' output failed")

    def publish_pending(self) -> None:
        """Every pending job, oldest success first (tests call it directly)."""
        with self.p.session() as db:
            ids = list(db.scalars(select(Job.id).where(Job.publish_state == PENDING).order_by(Job.finished_at)))
        for job_id in ids:
            if self._stop.is_set():
                return
            try:
                self.publish_one(job_id)
            except Exception:  # noqa: BLE001 - one job's trouble (the database busy) never holds the others back
                log.exception("publishing the output of job %s failed; it stays pending", job_id)

    def publish_one(self, job_id: str) -> None:
        with self.p.session() as db:
            job = db.get(Job, job_id)
            owner = db.get(User, job.user_id) if job is not None else None
            if job is None or owner is None or job.publish_state != PENDING:
                return
            try:
                target = publish_of(job)
            except ValueError as exc:  # a spec stored before today's rules
                _record(db, job, None, FAILED, {"model": "", "error": str(exc)})
                db.commit()
                return
            try:
                entry = _already(db, job, target) or _publish(self.p, db, owner, job, target)
            except (CalderaError, ValueError) as exc:  # a name taken meanwhile, a quota, a missing folder
                db.rollback()
                job = db.get(Job, job_id)
                entry = None
                outcome = FAILED, {"model": target.model, "error": getattr(exc, "message", None) or str(exc)}
            if entry is not None:
                outcome = self._copied(db, entry, target)
            if outcome is not None:  # else the server stopped the copy: the job stays pending for the next start
                _record(db, job, target, *outcome)
                db.commit()

    def _copied(self, db: Session, entry: CatalogueEntry, target: Publish) -> tuple[str, dict[str, Any]] | None:
        """How the version's copy ended, once it has; None when the server stopped it."""
        if entry.state == COPYING:
            catalogue_copies.start(self.p, entry.id)  # one a stopped server left: copied again
            catalogue_copies.wait(self.p, entry.id)
            db.refresh(entry)
        if entry.state == READY:
            return PUBLISHED, {"ref": f"{entry.name}@{entry.version}", "left_out": len(entry.left_out or [])}
        if entry.state == COPY_FAILED:  # a quota reached, the folder gone while it was copied
            return FAILED, {"model": target.model, "error": (entry.error or {}).get("reason", "")}
        return None


def _publish(p: Platform, db: Session, owner: User, job: Job, target: Publish) -> CatalogueEntry:
    """The API's publish of the folder, as the job's owner: the version, its copy started."""
    path = in_workspace(p, owner, job, target.path)
    body = api_catalogue.PublishIn(
        kind="model",
        name=target.model,
        version=target.version or job.id,
        path=path,
        description=target.description,
        visibility=target.visibility,
        shared_with=target.shared_with,
        framework=target.framework,
        from_job=job.id,
    )
    try:
        api_catalogue.begin_publish(body, Caller(owner, db, files.spaces_for(p)), p)
    except NoSuchPath:  # the tree names the first part missing; the owner wants the folder they asked for
        raise NoSuchPath(f"no folder {path or '.'} in {owner.username}'s workspace") from None
    return _already(db, job, target)


def in_workspace(p: Platform, owner: User, job: Job, path: str) -> str:
    """``path`` of the job's working directory as a path of its owner's workspace (its personal space)."""
    home = p.settings.workspaces / owner.username
    workdir = Path(os.path.normpath(job.workdir or home))
    if workdir != home and home not in workdir.parents:
        raise ValueError(f"its working directory {job.workdir} is not in {owner.username}'s workspace")
    joined = posixpath.normpath(posixpath.join(workdir.relative_to(home).as_posix(), path))
    return "" if joined == "." else joined


def _already(db: Session, job: Job, target: Publish) -> CatalogueEntry | None:
    """The version published for this job already (the server stopped before it said how its copy ended)."""
    return db.scalar(
        select(CatalogueEntry)
        .where(
            CatalogueEntry.kind == "model", CatalogueEntry.name == target.model, CatalogueEntry.produced_by == job.id
        )
        .order_by(CatalogueEntry.created_at.desc())
        .limit(1)
    )


def _record(db: Session, job: Job, target: Publish | None, state: str, result: dict[str, Any]) -> None:
    job.publish_state, job.publish_result = state, result
    if target is None:
        note(db, job, "PublishFailed", f"its output was not published: {result['error']}")
    elif state == PUBLISHED:
        note(db, job, "Published", f"its folder {target.path} was published as model {result['ref']}",
             {"ref": result["ref"], "path": target.path})  # fmt: skip
    else:
        message = f"its folder {target.path} was not published as model {target.model}: {result['error']}"
        note(db, job, "PublishFailed", message, {"model": target.model, "path": target.path, "error": result["error"]})


def mark_pending(job: Job) -> bool:
    """At the job's success (the loop): whether it has a folder to publish, now pending."""
    if (job.spec or {}).get("publish") is None:
        return False
    job.publish_state = PENDING
    return True
