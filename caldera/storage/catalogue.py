"""The datasets and models catalogue: a named, versioned copy of a space's folder that its owner shows to whom they
choose, and that jobs mount by name (``mounts: [{dataset: imagenet-mini@v1, at: /data/imagenet}]``).

Publishing copies the folder into the platform's own store (``<storage_dir>/catalogue/<folder>/data``, a random
name never reused, every folder on the way root's): a version never changes under the jobs that use it, and what a
job mounts is reached through no folder a user could swap for a link between the check and the mount. A publish is
checked and its version added at once, ``copying`` (``reserve``); the copy follows, in the server's background
(caldera/server/catalogue_copies.py), and makes it ``ready`` (``copy``, ``finish``) or ``failed`` with the reason
(``fail``); only a ready version is mounted, and only its owner and admins see the others. A name is
its first publisher's: only they (or an admin) add versions, so a job mounting a name alone never gets another
user's files. Readers: the owner and admins always; ``shared``: the users and the members of the accounts named in
``shared_with``; ``public``: everyone. A catalogue mount is read-only.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import delete, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from caldera.core import catalogue_names as names
from caldera.db.membership import user_accounts
from caldera.db.models import CatalogueEntry, CatalogueName, User
from caldera.storage.errors import (
    NameClash,
    NoAccess,
    NoSuchPath,
    NotReady,
    PathRefused,
    QuotaExceeded,
    catalogue_bytes_full,
    catalogue_entries_full,
)
from caldera.storage.paths import parts
from caldera.storage.service import Opened
from caldera.storage.tree import Copied

KINDS = ("dataset", "model")
COPYING, READY, FAILED = "copying", "ready", "failed"
NAME, VERSION, SHARE = re.compile(names.NAME), re.compile(names.VERSION), re.compile(names.SHARE)


@dataclass(frozen=True)
class Reader:
    """Who asks: what the visibility rules need to know of them."""

    user_id: int
    username: str
    admin: bool
    accounts: frozenset[str]

    @classmethod
    def of(cls, db: Session, user: User) -> Reader:
        return cls(user.id, user.username, user.role == "admin", frozenset(user_accounts(db, user)))


def named(who: Reader, shares: list[str]) -> bool:
    """Whether ``who`` is among ``shares`` (``user:<name>``, ``account:<name>``): by name or by an account of theirs."""
    return f"user:{who.username}" in shares or any(f"account:{a}" in shares for a in who.accounts)


def may_read(entry: CatalogueEntry, who: Reader) -> bool:
    """Its owner and admins see a version from its publish on; readers once it is ready."""
    if may_change(entry, who):
        return True
    if entry.state != READY:
        return False
    if entry.visibility == "public":
        return True
    return entry.visibility == "shared" and named(who, entry.shared_with)


def may_add(claim: CatalogueName, who: Reader) -> bool:
    """Whether ``who`` publishes versions under a claimed name: its owner, an admin, or one it was granted to."""
    return may_change(claim, who) or named(who, claim.writers or [])


def parse_ref(text: str) -> tuple[str, str | None]:
    """``name`` or ``name@version``."""
    name, _, version = text.partition("@")
    if not NAME.fullmatch(name) or (version and not VERSION.fullmatch(version)):
        raise PathRefused(f"{text[:100]!r} is not a catalogue name (name or name@version)")
    return name, version or None


class Catalogue:
    def __init__(self, store: Path, max_entries: int, quota_bytes: int):
        self.store = store  # <storage_dir>/catalogue: root's, 0700
        self.max_entries, self.quota_bytes = max_entries, quota_bytes  # each publisher's, all their versions

    def host_path(self, entry: CatalogueEntry) -> Path:
        return self.store / entry.folder / "data"

    def find(self, db: Session, who: Reader, kind: str, ref: str) -> CatalogueEntry:
        """The entry ``ref`` names (its newest ready version when none is given) that ``who`` may read."""
        name, version = parse_ref(ref)
        q = select(CatalogueEntry).where(CatalogueEntry.kind == kind, CatalogueEntry.name == name)
        if version is not None:
            q = q.where(CatalogueEntry.version == version)
        readable = [e for e in db.scalars(q.order_by(CatalogueEntry.created_at.desc())) if may_read(e, who)]
        if not readable:
            raise NoSuchPath(f"no {kind} {ref} that you may read")
        return next((e for e in readable if e.state == READY), readable[0])

    def search(self, db: Session, who: Reader, kind: str | None, text: str) -> list[CatalogueEntry]:
        q = select(CatalogueEntry).order_by(CatalogueEntry.kind, CatalogueEntry.name, CatalogueEntry.created_at)
        if kind is not None:
            q = q.where(CatalogueEntry.kind == kind)
        words = text.lower().split()
        out = []
        for e in db.scalars(q):
            hay = " ".join([e.name, e.version, e.description, e.framework, *e.tags]).lower()
            if may_read(e, who) and all(w in hay for w in words):
                out.append(e)
        return out

    def reserve(self, db: Session, owner: User, opened: Opened, path: str, entry: CatalogueEntry) -> None:
        """Add ``entry`` (its fields set by the caller) as ``owner``'s new version of the folder ``path`` of the
        opened space, copying: its name and version are taken, and it counts against ``owner``'s limits, from now;
        nobody mounts it before ``copy`` and ``finish`` made it ready. A version taken already is a clash (one whose
        copy failed is not: it gives way)."""
        clash = self.check_new(db, owner, entry.kind, entry.name, entry.version)
        self._within_limits(db, owner)
        if opened.tree.stat(parts(path)).kind != "dir":
            raise PathRefused(f"{path!r} is not a folder")
        entry.owner_id, entry.source, entry.created_at = owner.id, f"{opened.ref}/{path}".rstrip("/"), time.time()
        entry.folder, entry.state, entry.size_bytes, entry.files = secrets.token_hex(16), COPYING, 0, 0
        failed = (CatalogueEntry.kind == entry.kind, CatalogueEntry.name == entry.name, CatalogueEntry.state == FAILED)
        db.execute(delete(CatalogueEntry).where(*failed, CatalogueEntry.version == entry.version))
        self._insert(db, owner, entry, clash)

    def copy(
        self, db: Session, owner: User, opened: Opened, path: str, entry: CatalogueEntry, max_bytes: int,
        progress: Callable[[Copied], None],
    ) -> None:  # fmt: skip
        """Copy the folder ``path`` into ``entry``'s folder of the store, from the start (what a stopped server
        left of it is dropped first), and set its size, files and what was left out (with why). Its copy is named
        ``data`` (what jobs mount) only once complete."""
        folder = self.host_path(entry).parent
        shutil.rmtree(folder, ignore_errors=True)
        self.store.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder.mkdir(mode=0o700)
        partial = folder / ".copying"
        used = self._used_besides(db, owner, entry)
        db.commit()  # no transaction held while the copy runs (SQLite's write-ahead log cannot be folded behind one)
        try:
            copied = opened.tree.copy_folder(parts(path), str(partial), min(max_bytes, self.quota_bytes - used),
                                             progress)  # fmt: skip
        except QuotaExceeded:
            if self.quota_bytes - used < max_bytes:
                raise catalogue_bytes_full(self.quota_bytes, used) from None
            raise
        partial.chmod(0o755)  # what jobs mount, read-only, whatever the umask
        os.rename(partial, folder / "data")
        entry.size_bytes, entry.files, entry.left_out = copied.size, copied.files, copied.left_out

    def finish(self, db: Session, owner: User, entry: CatalogueEntry) -> None:
        """The copied version ready, within ``owner``'s limits with it (copies at once pass no limit together)."""
        self._within_limits(db, owner, entry)
        entry.state = READY

    def fail(self, db: Session, entry: CatalogueEntry, reason: dict) -> None:
        """The version's copy failed: it keeps the reason (``reason``, code, params) for its publisher to see, and
        no longer holds its version (a new publish of it replaces it), its name (when it was the name's only
        version), or its bytes; its folder is removed once the caller committed (``drop_copy``)."""
        entry.state, entry.error, entry.size_bytes, entry.files = FAILED, reason, 0, 0
        db.flush()
        self._free_name_if_unused(db, entry)

    def drop_copy(self, entry: CatalogueEntry) -> None:
        shutil.rmtree(self.host_path(entry).parent, ignore_errors=True)

    def _used_besides(self, db: Session, owner: User, entry: CatalogueEntry) -> int:
        """The bytes ``owner``'s other versions take (those being copied: so far)."""
        return db.scalar(
            select(func.coalesce(func.sum(CatalogueEntry.size_bytes), 0)).where(
                CatalogueEntry.owner_id == owner.id, CatalogueEntry.id != entry.id, CatalogueEntry.state != FAILED
            )
        )

    def check_new(self, db: Session, owner: User, kind: str, name: str, version: str | None) -> NameClash:
        """Refuse a version ``owner`` may not add: under another user's name, or (``version`` given) one that
        exists already. The clash to raise should the version be taken meanwhile."""
        self._may_add_to(db, owner, kind, name)
        clash = NameClash(f"{kind} {name}@{version} exists already")
        taken = select(CatalogueEntry.id).where(
            CatalogueEntry.kind == kind,
            CatalogueEntry.name == name,
            CatalogueEntry.version == version,
            CatalogueEntry.state != FAILED,
        )
        if version is not None and db.scalar(taken) is not None:
            raise clash
        return clash

    def _may_add_to(self, db: Session, owner: User, kind: str, name: str) -> CatalogueName | None:
        """A name is its first publisher's: else another user's new version would be what jobs mounting the name
        alone get, unless its owner granted them (``writers``). The name's claim, None while it has none."""
        claim = db.get(CatalogueName, (kind, name))
        if claim is not None and not may_add(claim, Reader.of(db, owner)):
            raise NoAccess(f"{kind} {name} is another user's: publish under a name of your own")
        return claim

    def claim(self, db: Session, who: Reader, kind: str, name: str) -> CatalogueName:
        """The name's claim, for its owner or an admin: who else may publish under it is theirs to say."""
        claim = db.get(CatalogueName, (kind, name))
        if claim is None:
            raise NoSuchPath(f"no {kind} {name} in the catalogue")
        if not may_change(claim, who):
            raise NoAccess(f"only the owner of {kind} {name} or an admin says who publishes under it")
        return claim

    def grant(self, db: Session, who: Reader, kind: str, name: str, writers: list[str]) -> CatalogueName:
        """Who besides its owner publishes versions under the name (the list replaces the one before)."""
        bad = [w for w in writers if not SHARE.fullmatch(w)]
        if bad:
            raise PathRefused(f"{bad[0][:80]!r} is neither user:<name> nor account:<name>")
        claim = self.claim(db, who, kind, name)
        claim.writers = sorted(set(writers))
        return claim

    def _insert(self, db: Session, owner: User, entry: CatalogueEntry, clash: NameClash) -> None:
        """The row, with the name's claim when it has none, in one flush: of two first publishes of a name at once,
        the claim's primary key lets one through and the other is refused as the name's owner's."""
        # one read decides both: a claim committed between a check and a second read would let this version in
        # under another user's name without claiming it
        if self._may_add_to(db, owner, entry.kind, entry.name) is None:  # claimed since the first check?
            db.add(CatalogueName(kind=entry.kind, name=entry.name, owner_id=owner.id))
        db.add(entry)
        try:
            db.flush()
        except IntegrityError:
            db.rollback()
            self._may_add_to(db, owner, entry.kind, entry.name)
            raise clash from None

    def _within_limits(self, db: Session, owner: User, added: CatalogueEntry | None = None) -> int:
        """Refuse when ``owner``'s versions are at ``max_entries`` or leave no byte of ``quota_bytes`` (with
        ``added``, a row just flushed: when it passes either); the bytes used without it."""
        count, size = db.execute(
            select(func.count(), func.coalesce(func.sum(CatalogueEntry.size_bytes), 0)).where(
                CatalogueEntry.owner_id == owner.id, CatalogueEntry.state != FAILED
            )
        ).one()
        adding = 0 if added is None else added.size_bytes
        count, size = count - (added is not None), size - adding
        if count >= self.max_entries:
            raise catalogue_entries_full(self.max_entries)
        if size + adding > self.quota_bytes or (added is None and size >= self.quota_bytes):
            raise catalogue_bytes_full(self.quota_bytes, size)
        return size

    def remove(self, db: Session, entry: CatalogueEntry) -> None:
        """The entry (and its name's claim with its last version), then its copy; the caller checked that no
        running job mounts it."""
        if entry.state == COPYING:
            raise NotReady(f"{entry.kind} {entry.name}@{entry.version} is being copied: delete it once it is ready")
        db.delete(entry)
        db.flush()
        self._free_name_if_unused(db, entry)
        db.commit()
        self.drop_copy(entry)

    def _free_name_if_unused(self, db: Session, entry: CatalogueEntry) -> None:
        """The name's claim goes with its last version (one whose copy failed holds no name)."""
        same_name = (CatalogueEntry.kind == entry.kind, CatalogueEntry.name == entry.name)
        if db.scalar(select(CatalogueEntry.id).where(*same_name, CatalogueEntry.state != FAILED).limit(1)) is None:
            db.execute(delete(CatalogueName).where(CatalogueName.kind == entry.kind, CatalogueName.name == entry.name))

    def sweep(self, db: Session, now: float) -> int:
        """Remove the store's folders that no entry names (an entry's owner was deleted, with their entries; a
        failed copy the server stopped before removing), left an hour at least. How many were removed."""
        if not self.store.is_dir():
            return 0
        named = set(db.scalars(select(CatalogueEntry.folder).where(CatalogueEntry.state != FAILED)))
        removed = 0
        for path in self.store.iterdir():
            if path.name not in named and os.lstat(path).st_ctime < now - 3600:
                shutil.rmtree(path, ignore_errors=True)
                removed += 1
        return removed


def require_ready(entry: CatalogueEntry) -> None:
    """Refuse a version that is not ready to be mounted, with why."""
    ref = f"{entry.kind} {entry.name}@{entry.version}"
    if entry.state == COPYING:
        raise NotReady(f"{ref} is still being copied ({entry.size_bytes} bytes so far): mount it once it is ready")
    if entry.state == FAILED:
        raise NotReady(f"{ref} was not published: {(entry.error or {}).get('reason', 'its copy failed')}")


def may_change(owned: CatalogueEntry | CatalogueName, who: Reader) -> bool:
    """Its owner and admins: who changes an entry (and sees where it was copied from and whom it is shared with),
    and who says who else publishes under a name."""
    return who.admin or owned.owner_id == who.user_id


def owner_or_admin(entry: CatalogueEntry, who: Reader) -> None:
    if not may_change(entry, who):
        raise NoAccess(f"only its owner or an admin changes {entry.kind} {entry.name}@{entry.version}")
