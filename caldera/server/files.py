"""The platform's storage spaces (caldera.storage) composed with what only the server knows: the OS identity a
personal space's files belong to, a thread that sets the usage counters right now and then, and the spaces a
job mounts (checked at submission and again at launch)."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from caldera.config import Settings
from caldera.core.spec import JobSpec, Mount
from caldera.core.states import JobState
from caldera.db.models import CatalogueEntry, Job, User
from caldera.errors import CalderaError, Invalid, InvalidFields, field_error
from caldera.server import identity, imports
from caldera.server.platform import Platform
from caldera.storage.backends.registry import create_backend
from caldera.storage.catalogue import Catalogue, Reader, require_ready
from caldera.storage.errors import NameClash
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
    """Walks the spaces whose counters are older than ``storage_reconcile_s``, and removes the catalogue copies
    that no entry names, in a thread of its own."""

    def __init__(self, platform: Platform, spaces: Spaces, period_s: float = 60.0):
        self.platform, self.spaces, self.period_s = platform, spaces, period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="storage-reconciler", daemon=True)

    def start(self) -> None:
        imports.recover(self.platform, self.spaces)
        self._sweep_catalogue()
        self._thread.start()

    def _sweep_catalogue(self) -> None:
        with self.platform.session() as db:
            catalogue_for(self.platform.settings).sweep(db, time.time())

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                with self.platform.session() as db:
                    self.spaces.reconcile_due(db, time.time())
                self._sweep_catalogue()
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


def catalogue_for(settings: Settings) -> Catalogue:
    return Catalogue(settings.spaces_dir / "catalogue", settings.catalogue_max_entries, settings.catalogue_quota_bytes)


def _mount_source(p: Platform, spaces: Spaces, db: Session, user: User, mount: Mount) -> Path:
    """Where the mount comes from on the host, once ``user`` is found to be allowed it: a space (its root made if
    it is not there yet) or a catalogue entry's copy."""
    if mount.space is None:
        kind = "dataset" if mount.dataset is not None else "model"
        catalogue = catalogue_for(p.settings)
        entry = catalogue.find(db, Reader.of(db, user), kind, mount.dataset or mount.model or "")
        require_ready(entry)  # being copied, or its copy failed: refused with why
        return catalogue.host_path(entry)
    ref = _mount_target(spaces, db, user, mount)
    spaces.tree(db, ref)  # its root exists, with its owner
    host = spaces.backend.host_path(ref)
    if host is None:
        raise Invalid("space", f"the {spaces.backend.name} storage backend cannot mount spaces into jobs")
    return host


def _source_field(mount: Mount) -> str:
    return "space" if mount.space is not None else "dataset" if mount.dataset is not None else "model"


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
            _mount_source(p, spaces, db, user, mount)
        except CalderaError as exc:
            errors.append(field_error(f"mounts.{i}.{_source_field(mount)}", exc.message))
    if errors:
        raise InvalidFields(errors)


def check_publish(p: Platform, db: Session, user: User, spec: JobSpec) -> None:
    """At submission: a job publishes its output only under a model name the user may add versions to, and at a
    version not taken yet (checked again when it publishes)."""
    if spec.publish is None:
        return
    target = spec.publish
    try:
        catalogue_for(p.settings).check_new(db, user, "model", target.model, target.version)
    except CalderaError as exc:
        field = "publish.version" if isinstance(exc, NameClash) else "publish.model"
        raise InvalidFields([field_error(field, exc.message)]) from None


def host_mounts(p: Platform, db: Session, user: User, spec: JobSpec) -> tuple[tuple[str, str, bool], ...]:
    """At launch, checked again: (host path, path in the job, writable) for the runtime."""
    spaces = spaces_for(p)
    return tuple((str(_mount_source(p, spaces, db, user, m).resolve()), m.at, m.writable) for m in spec.mounts)


def _active_jobs(db: Session):
    active = (JobState.STARTING.value, JobState.RUNNING.value)
    return db.execute(select(Job.id, Job.spec, User.username).join(User).where(Job.state.in_(active)))


def catalogue_mounts(db: Session, entry: CatalogueEntry) -> list[str]:
    """The starting or running jobs that mount ``entry``'s name at its version, or at no version (the newest they
    could read when they started: possibly this one, so counted)."""
    names = (entry.name, f"{entry.name}@{entry.version}")
    return sorted(
        job_id
        for job_id, spec, _ in _active_jobs(db)
        if any(m.get(entry.kind) in names for m in spec.get("mounts") or ())
    )


def running_mounts(db: Session, ref: SpaceRef) -> list[str]:
    """The jobs on a node now (starting or running) that see ``ref``: mount it, or, for a personal space, work
    in it (every job of its user)."""
    rows = _active_jobs(db)
    return sorted(
        job_id
        for job_id, spec, username in rows
        if ref == SpaceRef(Kind.PERSONAL, username)
        or any(_same(m.get("space") or "", username, ref) for m in spec.get("mounts") or ())
    )


def _same(text: str, username: str, ref: SpaceRef) -> bool:
    try:
        return parse_ref(text, username) == ref
    except CalderaError:  # a spec stored before a rule changed: not this space
        return False
