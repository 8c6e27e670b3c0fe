"""Imports from URL (caldera/storage/fetch.py) run in a thread of the server each, their progress in their row:
the bytes so far, the total when the server said it, and why one failed. The bytes so far count against the
space's quota until the import ends. An import whose connection broke (or that a server restart interrupted) keeps
its part file and is restarted where it ends, unless a day passes first (``Spaces.reconcile_due``); any other
failure drops the part. Part files that nothing holds are removed at startup (``recover``). A repository's import
(``hf://``, caldera/storage/hub.py) is a group of such imports, one per file, run in turn by its head's thread
(caldera/server/repo_imports.py)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sqlalchemy import update

from caldera.db.models import StorageImport, StorageSpace
from caldera.errors import CalderaError, Conflict
from caldera.server import repo_imports
from caldera.server.platform import Platform
from caldera.storage import fetch, hub
from caldera.storage.errors import NoSuchPath
from caldera.storage.paths import file_parts
from caldera.storage.service import Opened, Spaces
from caldera.storage.spaces import Access, Kind, SpaceRef

log = logging.getLogger(__name__)
_PROGRESS_EVERY_S = 0.5
MAX_PER_USER = 4  # downloads one user may have going at once: each is a thread and a connection of the server
_running: dict[str, int] = {}  # import id: its user's id, for the imports with a thread in this server
_lock = threading.Lock()


def running_here(import_id: str) -> bool:
    with _lock:
        return import_id in _running


def start(platform: Platform, spaces: Spaces, import_id: str, user_id: int, commit: Callable[[], None]) -> None:
    """``commit`` the import's row and start its download in a thread; refused (Conflict, nothing committed) when
    the user has MAX_PER_USER going already."""
    with _lock:
        if import_id in _running:
            return
        if sum(u == user_id for u in _running.values()) >= MAX_PER_USER:
            raise Conflict(f"you have {MAX_PER_USER} imports running; start this one when one has ended")
        _running[import_id] = user_id
    try:
        commit()
    except BaseException:
        with _lock:
            _running.pop(import_id, None)
        raise
    threading.Thread(target=_run, args=(platform, spaces, import_id), name=f"import-{import_id}", daemon=True).start()


def _run(platform: Platform, spaces: Spaces, import_id: str) -> None:
    try:
        with platform.session() as db:
            imp = db.get(StorageImport, import_id)
            repo = imp is not None and hub.is_repo(imp.url)
        (_run_repo if repo else _run_file)(platform, spaces, import_id)
    except Exception:  # noqa: BLE001 - a thread of its own: logged, the import stays restartable
        log.exception("import %s failed", import_id)
    finally:
        with _lock:
            _running.pop(import_id, None)


def _opened(spaces: Spaces, db, imp: StorageImport | None) -> Opened | None:
    row = db.get(StorageSpace, imp.space_id) if imp else None
    if imp is None or row is None:
        return None
    ref = SpaceRef(Kind(row.kind), row.name)
    return Opened(ref, row, spaces.tree(db, ref), Access.WRITE)


def _run_file(platform: Platform, spaces: Spaces, import_id: str) -> None:
    with platform.session() as db:
        imp = db.get(StorageImport, import_id)
        opened = _opened(spaces, db, imp)
        if opened is None:
            return
        try:
            _download(platform, spaces, db, imp, opened)
            imp.error = ""
        except (fetch.FetchFailed, CalderaError, OSError) as exc:
            imp.state, imp.error = "failed", getattr(exc, "message", None) or str(exc)
            if not getattr(exc, "resumable", False):
                opened.tree.drop_part(imp.id)
            imp.done_bytes = _part_size(opened, imp.id)
        imp.finished_at = time.time()
        db.commit()


def _run_repo(platform: Platform, spaces: Spaces, head_id: str) -> None:
    """A repository's files one after another, each an import of its own (``repo_imports``), listed from the mirror
    on the first run; a restart goes on with those not done. The first that fails stops it (the rest stay queued)."""
    with platform.session() as db:
        head = db.get(StorageImport, head_id)
        opened = _opened(spaces, db, head)
        if opened is None:
            return
        try:
            if not platform.settings.huggingface_mirror_url:
                raise fetch.FetchFailed(hub.NO_MIRROR)
            files = repo_imports.files_of(db, head) or repo_imports.list_files(platform.settings, spaces, db, head,
                                                                               opened)  # fmt: skip
            for file in files:
                if file.state == "done":
                    continue
                repo_imports.make_folders(spaces, db, opened, file.path)
                file.state, file.error, file.finished_at = "running", "", None
                db.commit()
                _run_file(platform, spaces, file.id)
                db.refresh(file)
                if file.state != "done":
                    raise fetch.FetchFailed(file.error or "stopped")
            head.state, head.error = "done", ""
        except (fetch.FetchFailed, CalderaError, OSError) as exc:
            head.state, head.error = "failed", getattr(exc, "message", None) or str(exc)
        head.finished_at = time.time()
        db.commit()


def _download(platform: Platform, spaces: Spaces, db, imp: StorageImport, opened: Opened) -> None:
    tree, names = opened.tree, file_parts(imp.path)
    try:
        have = tree.part_size(imp.id)
    except NoSuchPath:
        tree.new_part(imp.id)
        have = 0
    allowed = fetch.allowed_networks(platform.settings)
    limit = min(platform.settings.storage_max_upload_bytes, spaces.room(db, opened) + imp.done_bytes)
    last = [0.0]

    def progress(done: int) -> None:
        if time.monotonic() - last[0] >= _PROGRESS_EVERY_S:
            last[0] = time.monotonic()
            with platform.session() as other:  # seen by a GET, and counted against the quota, as it goes on
                other.execute(update(StorageImport).where(StorageImport.id == imp.id).values(done_bytes=done))
                other.commit()
                spaces.headroom(other, other.get(StorageSpace, opened.row.id), 0, 0)  # others' writes meanwhile

    with fetch.open_stream(imp.url, allowed, have) as (response, offset):
        if offset != have:  # the server sends it all again
            tree.drop_part(imp.id)
            tree.new_part(imp.id)
        imp.total_bytes = fetch.total_of(response, offset)
        db.commit()
        with tree.part_writer(imp.id, offset) as part:
            imp.done_bytes = fetch.copy(response, part, offset, limit, progress)
    if imp.total_bytes is not None and imp.done_bytes != imp.total_bytes:
        raise fetch.FetchFailed(f"the download broke off at byte {imp.done_bytes} of {imp.total_bytes}", True)
    imp.state = "done"  # from here its bytes are counted as the file's, not as an unfinished import's
    db.commit()
    spaces.commit_part(db, opened, imp.id, names, imp.done_bytes)  # counted, renamed; a clash drops the part


def _part_size(opened: Opened, import_id: str) -> int:
    try:
        return opened.tree.part_size(import_id)
    except NoSuchPath:
        return 0


def recover(platform: Platform, spaces: Spaces) -> None:
    """At startup, before any import starts: those a stopped server left running have failed (restartable, their
    part kept and counted), and part files that no upload or import holds are removed."""
    with platform.session() as db:
        db.execute(
            update(StorageImport)
            .where(StorageImport.state == "running")
            .values(state="failed", error="interrupted: the server stopped", finished_at=time.time())
        )
        db.commit()
        removed = spaces.sweep_parts(db)
    if removed:
        log.info("removed %d part files that no upload or import held", removed)
