"""Publishing's copy (caldera/storage/catalogue.py) in the server's background, a thread per version, as imports
from URL run (caldera/server/imports.py): the request checked everything and added the version, ``copying``; its
thread copies the folder as its publisher (who must still be allowed to write it), with the size and files copied
so far in the version's row (what ``GET`` shows, and what counts against the publisher's catalogue bytes), and makes
it ``ready``, or ``failed`` with the reason (its version and name free again). Both the API's publish and a job
spec's (caldera/server/job_publish.py) copy here.

``stop`` (the server's end) stops each copy between two files; a version a stopped or killed server left copying
is copied again from the start at the next start (``recover``): nothing is mounted before it is ready, and nothing
is lost. ``catalogue_copy_bytes_per_s`` paces a copy, so that a large one leaves the disks to jobs.
"""

from __future__ import annotations

import logging
import threading
import time

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from caldera.db.models import CatalogueEntry, User
from caldera.errors import CalderaError
from caldera.server import files
from caldera.server.api_files import Caller
from caldera.server.platform import Platform
from caldera.storage.catalogue import COPYING
from caldera.storage.errors import NoSuchPath
from caldera.storage.spaces import Access
from caldera.storage.tree import Copied

log = logging.getLogger(__name__)
_PROGRESS_EVERY_S = 0.5
MAX_PER_USER = 4  # versions one user may have copying at once: each is a thread of the server
_running: dict[tuple[int, int], threading.Thread] = {}  # (id of the platform, entry id): its copy's thread
_stops: dict[int, threading.Event] = {}  # id of the platform: set by its server's end
_lock = threading.Lock()


class _Stopped(Exception):
    """The server is stopping: the version stays copying, for the next start."""


def start(platform: Platform, entry_id: int) -> None:
    """Copy the version in a thread of its own (the row committed, copying); nothing when it is being copied."""
    key = (id(platform), entry_id)
    with _lock:
        if key in _running:
            return
        stop = _stops.setdefault(id(platform), threading.Event())
        thread = threading.Thread(target=_run, args=(platform, entry_id, stop), name=f"publish-{entry_id}", daemon=True)
        _running[key] = thread
    thread.start()


def wait(platform: Platform, entry_id: int) -> None:
    """Until the version's copy has ended (ready, failed, or stopped with the server)."""
    with _lock:
        thread = _running.get((id(platform), entry_id))
    if thread is not None:
        thread.join()


def recover(platform: Platform) -> None:
    """At startup: copy again, from the start, every version a stopped server left copying."""
    with platform.session() as db:
        ids = list(db.scalars(select(CatalogueEntry.id).where(CatalogueEntry.state == COPYING)))
    for entry_id in ids:
        start(platform, entry_id)
    if ids:
        log.info("copying again %d catalogue versions a stopped server left copying", len(ids))


def stop(platform: Platform) -> None:
    """At the server's end: each copy stops before its next file; its version stays copying."""
    with _lock:
        event = _stops.pop(id(platform), None)
        threads = [t for (p, _), t in _running.items() if p == id(platform)]
    if event is not None:
        event.set()
    for thread in threads:
        thread.join(timeout=10)


def copying_count(db: Session, user: User) -> int:
    """The user's versions being copied (or left copying by a stopped server, to be copied at its next start)."""
    mine = (CatalogueEntry.owner_id == user.id, CatalogueEntry.state == COPYING)
    return db.scalar(select(func.count()).select_from(CatalogueEntry).where(*mine))


def _run(platform: Platform, entry_id: int, stop: threading.Event) -> None:
    try:
        _copy(platform, entry_id, stop)
    except Exception:  # noqa: BLE001 - a thread of its own: logged; the version stays copying for the next start
        log.exception("copying catalogue version %s failed", entry_id)
    finally:
        with _lock:
            _running.pop((id(platform), entry_id), None)


def _copy(platform: Platform, entry_id: int, stop: threading.Event) -> None:
    catalogue = files.catalogue_for(platform.settings)
    with platform.session() as db:
        entry = db.get(CatalogueEntry, entry_id)
        owner = db.get(User, entry.owner_id) if entry is not None else None
        if entry is None or owner is None or entry.state != COPYING:
            return
        space, _, path = entry.source.partition("/")
        try:
            opened = Caller(owner, db, files.spaces_for(platform)).open(space, Access.WRITE)
            db.commit()  # no write of this session is held while the copy runs (SQLite: every writer's lock)
            progress = _Progress(platform, entry_id, stop)
            catalogue.copy(db, owner, opened, path, entry, platform.settings.storage_max_upload_bytes, progress)
            catalogue.finish(db, owner, entry)
            db.commit()
        except _Stopped:
            db.rollback()
        except (CalderaError, OSError) as exc:
            db.rollback()
            entry = db.get(CatalogueEntry, entry_id)
            catalogue.fail(db, entry, _reason(exc, entry.source))
            db.commit()
            catalogue.drop_copy(entry)


class _Progress:
    """Told of each file copied: stops the copy when the server stops, paces it (``catalogue_copy_bytes_per_s``),
    and writes the size and files so far into the version's row now and then, in a session of its own."""

    def __init__(self, platform: Platform, entry_id: int, stop: threading.Event):
        self.platform, self.entry_id, self.stop = platform, entry_id, stop
        self.rate = platform.settings.catalogue_copy_bytes_per_s
        self.began = self.written = time.monotonic()

    def __call__(self, copied: Copied) -> None:
        if self.stop.is_set():
            raise _Stopped()
        if self.rate and self.stop.wait(max(0.0, self.began + copied.size / self.rate - time.monotonic())):
            raise _Stopped()
        if time.monotonic() - self.written >= _PROGRESS_EVERY_S:
            self.written = time.monotonic()
            _record(self.platform, self.entry_id, copied)


def _record(platform: Platform, entry_id: int, copied: Copied) -> None:
    """The size and files copied so far, seen by ``GET`` and counted against the publisher's catalogue bytes."""
    with platform.session() as db:
        db.execute(update(CatalogueEntry).where(CatalogueEntry.id == entry_id, CatalogueEntry.state == COPYING)
                   .values(size_bytes=copied.size, files=copied.files))  # fmt: skip
        db.commit()


def _reason(exc: CalderaError | OSError, source: str) -> dict:
    """Why a copy failed, as a field error's row: the English, and the code and values the portal says it in
    its reader's language by (caldera/server/web/reason_text.py)."""
    if isinstance(exc, NoSuchPath):
        code, params, message = "PublishSourceGone", {"source": source}, f"the folder {source} is gone"
    elif isinstance(exc, CalderaError):
        code, params, message = exc.code, exc.params or {}, exc.message
    else:
        error = exc.strerror or str(exc)
        code, params, message = "PublishCopyFailed", {"error": error}, f"the copy failed: {error}"
    return {"reason": message, "code": code, "params": params}
