"""The platform's storage spaces (caldera.storage) composed with what only the server knows: the OS identity a
personal space's files belong to, a thread that sets the usage counters right now and then, and the spaces a
job mounts (checked at submission and again at launch)."""

from __future__ import annotations

import logging
import threading
import time

from sqlalchemy import select
from sqlalchemy.orm import Session

from caldera.core.spec import JobSpec, Mount
from caldera.core.states import JobState
from caldera.db.models import Job, User
from caldera.errors import CalderaError, Invalid, InvalidFields, field_error
from caldera.server import identity
from caldera.server.platform import Platform
from caldera.storage.backends.registry import create_backend
from caldera.storage.service import Spaces
from caldera.storage.spaces import Access, Kind, SpaceRef, parse_ref, require
from caldera.storage.tree import Owner

log = logging.getLogger(__name__)


def spaces_for(platform: Platform) -> Spaces:
    settings = platform.settings

    def owner_of(db: Session, user: User) -> Owner | None:
        run_as = identity.run_as(settings, db, user)
        db.commit()  # a uid chosen now is kept
        return None if run_as is None else Owner(run_as.uid, run_as.gid)

    return Spaces(settings, create_backend(settings), owner_of)


class Reconciler:
    """Walks the spaces whose counters are older than ``storage_reconcile_s``, in a thread of its own."""

    def __init__(self, platform: Platform, spaces: Spaces, period_s: float = 60.0):
        self.platform, self.spaces, self.period_s = platform, spaces, period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="storage-reconciler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                with self.platform.session() as db:
                    self.spaces.reconcile_due(db, time.time())
            except Exception:  # noqa: BLE001 - a space that cannot be walked now is walked next time
                log.exception("storage reconciliation failed")


def _mount_target(spaces: Spaces, db: Session, user: User, mount: Mount) -> SpaceRef:
    """The space ``user`` may mount as asked: read access, or write access for a writable mount (a member whose
    mode is rw in an account's space, an admin; what a job writes there is counted by the next reconciliation)."""
    ref = spaces.resolve(db, user, mount.space)
    row = spaces.row(db, ref)
    require(spaces.access_of(db, user, ref, row), Access.WRITE if mount.writable else Access.READ, ref)
    if mount.writable:
        spaces.headroom(db, row, 0, 0)  # a space over its quota takes no job that writes to it
    return ref


def check_mounts(p: Platform, db: Session, user: User, spec: JobSpec) -> None:
    """At submission: each mount the user may not have is refused with its reason; and any job while the user's
    personal space, where every job works, is over its quota."""
    spaces = spaces_for(p)
    errors = []
    try:
        spaces.headroom(db, spaces.row(db, SpaceRef(Kind.PERSONAL, user.username)), 0, 0)
    except CalderaError as exc:
        errors.append(field_error("workdir", f"your personal space (every job's working directory): {exc.message}"))
    for i, mount in enumerate(spec.mounts):
        try:
            ref = _mount_target(spaces, db, user, mount)
            if spaces.backend.host_path(ref) is None:
                raise Invalid("space", f"the {spaces.backend.name} storage backend cannot mount spaces into jobs")
        except CalderaError as exc:
            errors.append(field_error(f"mounts.{i}.space", exc.message))
    if errors:
        raise InvalidFields(errors)


def host_mounts(p: Platform, db: Session, user: User, spec: JobSpec) -> tuple[tuple[str, str, bool], ...]:
    """At launch, checked again: (host path, path in the job, writable) for the runtime; each space's root is made
    if it is not there yet."""
    spaces = spaces_for(p)
    out = []
    for mount in spec.mounts:
        ref = _mount_target(spaces, db, user, mount)
        spaces.tree(db, ref)  # its root exists, with its owner
        host = spaces.backend.host_path(ref)
        if host is None:
            raise Invalid("mounts", f"the {spaces.backend.name} storage backend cannot mount spaces into jobs")
        out.append((str(host.resolve()), mount.at, mount.writable))
    return tuple(out)


def running_mounts(db: Session, ref: SpaceRef) -> list[str]:
    """The jobs on a node now (starting or running) that see ``ref``: mount it, or, for a personal space, work
    in it (every job of its user)."""
    active = (JobState.STARTING.value, JobState.RUNNING.value)
    rows = db.execute(select(Job.id, Job.spec, User.username).join(User).where(Job.state.in_(active)))
    return sorted(
        job_id
        for job_id, spec, username in rows
        if ref == SpaceRef(Kind.PERSONAL, username)
        or any(_same(m.get("space", ""), username, ref) for m in spec.get("mounts") or ())
    )


def _same(text: str, username: str, ref: SpaceRef) -> bool:
    try:
        return parse_ref(text, username) == ref
    except CalderaError:  # a spec stored before a rule changed: not this space
        return False
