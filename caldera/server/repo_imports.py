"""An import of a repository (caldera/storage/hub.py) is a group of imports from URL, without a table of its own:
its head (``url`` the ``hf://`` source, ``path`` the new folder, never bytes of its own) and one import per file
(``url`` the file's address on the mirror, ``path`` the file in the folder), queued until its turn. They are one
group by their ids: the head's ends in ``00000000``, its files' share its first 24 characters and end in their
number. Each file is an import like any other (fetch, part file, quota, restart where it broke off); the head's
thread runs them in turn (caldera/server/imports.py) and its view sums them."""

from __future__ import annotations

import secrets
import time

from sqlalchemy import select

from caldera.config import Settings
from caldera.db.models import StorageImport
from caldera.storage import fetch, hub
from caldera.storage.errors import NameClash, NoSuchPath
from caldera.storage.paths import file_parts
from caldera.storage.service import Opened, Spaces

_HEAD = "0" * 8


def head_id() -> str:
    return secrets.token_hex(12) + _HEAD


def files_of(db, head: StorageImport) -> list[StorageImport]:
    """The head's files, in the repository's order."""
    group = head.id[:24]
    where = (StorageImport.id > head.id, StorageImport.id <= group + "f" * 8, StorageImport.user_id == head.user_id)
    return list(db.scalars(select(StorageImport).where(*where).order_by(StorageImport.id)))


def head_of(db, imp: StorageImport) -> StorageImport | None:
    """The repository import ``imp`` is a file of, if it is one."""
    if imp.id.endswith(_HEAD) or hub.is_repo(imp.url):
        return None
    head = db.get(StorageImport, imp.id[:24] + _HEAD)
    return head if head is not None and head.user_id == imp.user_id and hub.is_repo(head.url) else None


def list_files(settings: Settings, spaces: Spaces, db, head: StorageImport, opened: Opened) -> list[StorageImport]:
    """Ask the mirror for the repository's files and queue an import for each, at the revision's commit when the
    mirror names it (a restart gets the same files though the branch moved). A repository whose stated sizes
    cannot fit the space is refused before a byte is fetched."""
    repo, mirror = hub.parse(head.url), settings.huggingface_mirror_url
    listed = hub.listing(hub.read_listing(repo.listing_url(mirror), fetch.allowed_networks(settings)))
    stated = sum(size or 0 for _, size in listed.files)
    room = spaces.room(db, opened)
    if stated > room:
        raise fetch.FetchFailed(f"the repository's files take {stated} bytes and the space has room for {room}")
    revision, now = listed.commit or repo.revision, time.time()
    files = [
        StorageImport(
            id=f"{head.id[:24]}{n:08x}",
            user_id=head.user_id,
            space_id=head.space_id,
            path=f"{head.path}/{name}",
            url=repo.file_url(mirror, name, revision),
            state="queued",
            done_bytes=0,
            total_bytes=size,
            error="",
            created_at=now,
        )  # fmt: skip
        for n, (name, size) in enumerate(listed.files, 1)
    ]
    db.add_all(files)
    db.commit()
    return files


def make_folders(spaces: Spaces, db, opened: Opened, path: str) -> None:
    """The folders a file's path goes through, made where missing (each counted as an entry of the space)."""
    names = file_parts(path)
    for depth in range(1, len(names)):
        try:
            opened.tree.stat(names[:depth])
        except NoSuchPath:
            try:
                spaces.mkdir(db, opened, "/".join(names[:depth]))
            except NameClash:  # made meanwhile
                pass


def view(db, head: StorageImport) -> dict:
    """The head's progress from its files': bytes so far, the total once every size is known, and each file."""
    files = files_of(db, head)
    totals = [f.total_bytes for f in files]
    return {
        "done_bytes": sum(f.done_bytes for f in files),
        "total_bytes": sum(totals) if files and None not in totals else None,  # type: ignore[arg-type]
        "files_done": sum(f.state == "done" for f in files),
        "files": [
            {
                "id": f.id,
                "path": f.path,
                "state": f.state,
                "done_bytes": f.done_bytes,
                "total_bytes": f.total_bytes,
                "error": f.error,
            }  # fmt: skip
            for f in files
        ],
    }
