"""Spaces with their rows: who may open one, its quotas, and the usage counters every write through the platform
moves (an atomic conditional UPDATE, so two uploads at once never pass a quota together). A job writes its
personal space directly; ``reconcile`` sets the counters from one walk, run now and then, never per request."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from caldera.config import Settings
from caldera.db.membership import user_accounts
from caldera.db.models import Account, StorageImport, StorageMemberMode, StorageSpace, StorageUpload, User
from caldera.storage.backends.base import StorageBackend
from caldera.storage.errors import NameClash, NoSuchPath, PathRefused, QuotaExceeded
from caldera.storage.paths import file_parts
from caldera.storage.spaces import Access, Kind, SpaceRef, access, parse_ref, require
from caldera.storage.tree import Owner, Tree

OwnerOf = Callable[[Session, User], Owner | None]  # the uid a personal space's files belong to


@dataclass
class Opened:
    ref: SpaceRef
    row: StorageSpace
    tree: Tree
    access: Access


class Spaces:
    def __init__(self, settings: Settings, backend: StorageBackend, owner_of: OwnerOf):
        self.settings, self.backend, self.owner_of = settings, backend, owner_of

    # -- finding and opening ----------------------------------------------------------------------------------

    def resolve(self, db: Session, user: User, text: str) -> SpaceRef:
        ref = parse_ref(text, user.username)
        if ref.kind is Kind.PERSONAL and db.scalar(select(User.id).where(User.username == ref.name)) is None:
            raise NoSuchPath(f"no space {ref}")
        if ref.kind is Kind.ACCOUNT and db.scalar(select(Account.id).where(Account.name == ref.name)) is None:
            raise NoSuchPath(f"no space {ref}")
        return ref

    def row(self, db: Session, ref: SpaceRef) -> StorageSpace:
        where = (StorageSpace.kind == ref.kind.value, StorageSpace.name == ref.name)
        found = db.scalar(select(StorageSpace).where(*where))
        if found is not None:
            return found
        row = StorageSpace(kind=ref.kind.value, name=ref.name, used_bytes=0, used_files=0, created_at=time.time())
        db.add(row)
        try:
            db.commit()
        except IntegrityError:  # made at the same moment by another request
            db.rollback()
            return self.row(db, ref)
        return row

    def access_of(self, db: Session, user: User, ref: SpaceRef, row: StorageSpace) -> Access:
        mode = None
        if ref.kind is Kind.ACCOUNT and ref.name in user_accounts(db, user):
            stored = db.get(StorageMemberMode, (row.id, user.id))
            mode = stored.mode if stored else "rw"
        return access(ref, username=user.username, admin=user.role == "admin", member_mode=mode)

    def open(self, db: Session, user: User, text: str, need: Access) -> Opened:
        ref = self.resolve(db, user, text)
        row = self.row(db, ref)
        have = self.access_of(db, user, ref, row)
        require(have, need, ref)
        return Opened(ref, row, self.tree(db, ref), have)

    def tree(self, db: Session, ref: SpaceRef) -> Tree:
        owner = None
        if ref.kind is Kind.PERSONAL:
            owner = self.owner_of(db, db.scalar(select(User).where(User.username == ref.name)))
        return self.backend.store(ref, owner)

    def visible(self, db: Session, user: User) -> list[SpaceRef]:
        """The spaces ``user`` may read and is expected to: their own, their accounts' (every account's for an
        admin) and the public one."""
        admin = user.role == "admin"
        accounts = list(db.scalars(select(Account.name).order_by(Account.name))) if admin else user_accounts(db, user)
        return [SpaceRef(Kind.PERSONAL, user.username), *(SpaceRef(Kind.ACCOUNT, a) for a in accounts),
                SpaceRef(Kind.PUBLIC)]  # fmt: skip

    # -- quotas and counters ----------------------------------------------------------------------------------

    def quota(self, row: StorageSpace) -> tuple[int, int]:
        return (
            self.settings.storage_quota_bytes if row.quota_bytes is None else row.quota_bytes,
            self.settings.storage_quota_files if row.quota_files is None else row.quota_files,
        )

    def view(self, ref: SpaceRef, row: StorageSpace, have: Access) -> dict:
        quota_bytes, quota_files = self.quota(row)
        return {
            "space": str(ref),
            "kind": ref.kind.value,
            "access": {Access.READ: "read", Access.WRITE: "write"}.get(have, "none"),
            "used_bytes": row.used_bytes,
            "used_files": row.used_files,
            "quota_bytes": quota_bytes,
            "quota_files": quota_files,
            "over_quota": row.used_bytes > quota_bytes or row.used_files > quota_files,
            "reconciled_at": row.reconciled_at,
        }

    def pending(self, db: Session, row: StorageSpace) -> int:
        """Bytes of the space's unfinished imports that have a part file (running, or failed and to be resumed):
        counted against its quota until they end, are abandoned or swept."""
        where = (StorageImport.space_id == row.id, StorageImport.state != "done")
        return db.scalar(select(func.coalesce(func.sum(StorageImport.done_bytes), 0)).where(*where)) or 0

    def headroom(self, db: Session, row: StorageSpace, nbytes: int, nfiles: int) -> None:
        """Refuse when ``nbytes`` more bytes and ``nfiles`` more entries would not fit now (no reservation)."""
        db.refresh(row)
        quota_bytes, quota_files = self.quota(row)
        used = row.used_bytes + self.pending(db, row)
        if used + nbytes > quota_bytes:
            raise QuotaExceeded(
                f"the space's quota is {quota_bytes} bytes and {used} are used (unfinished imports too): {nbytes} "
                "more do not fit"
            )
        if row.used_files + nfiles > quota_files:
            raise QuotaExceeded(f"the space's quota is {quota_files} files and {row.used_files} are used")

    def reserve(self, db: Session, row: StorageSpace, nbytes: int, nfiles: int) -> None:
        """Count ``nbytes`` and ``nfiles`` more, atomically and only if they fit the quota (with the unfinished
        imports' bytes)."""
        quota_bytes, quota_files = self.quota(row)
        pending = self.pending(db, row)
        done = db.execute(
            update(StorageSpace)
            .where(
                StorageSpace.id == row.id,
                StorageSpace.used_bytes + nbytes + pending <= quota_bytes,
                StorageSpace.used_files + nfiles <= quota_files,
            )
            .values(used_bytes=StorageSpace.used_bytes + nbytes, used_files=StorageSpace.used_files + nfiles)
        ).rowcount
        db.commit()
        if not done:
            self.headroom(db, row, nbytes, nfiles)  # raises with the numbers
            raise QuotaExceeded("the space's quota is reached")

    def release(self, db: Session, row: StorageSpace, nbytes: int, nfiles: int) -> None:
        db.execute(
            update(StorageSpace)
            .where(StorageSpace.id == row.id)
            .values(used_bytes=StorageSpace.used_bytes - nbytes, used_files=StorageSpace.used_files - nfiles)
        )
        db.commit()

    def reconcile(self, db: Session, row: StorageSpace) -> None:
        """Set the counters from a walk of the space (what jobs wrote directly is counted here); the caller commits
        (an admin's reconcile with its audit entry, in one transaction)."""
        ref = SpaceRef(Kind(row.kind), row.name)
        size, count = self.tree(db, ref).usage()
        row.used_bytes, row.used_files, row.reconciled_at = size, count, time.time()

    def reconcile_due(self, db: Session, now: float) -> int:
        """Walk the spaces whose counters were last set right longer ago than ``storage_reconcile_s``; drop
        uploads left unfinished for a day, and the bytes of imports that failed a day ago and were not restarted.
        How many spaces were walked."""
        stale = now - self.settings.storage_reconcile_s
        rows = list(
            db.scalars(
                select(StorageSpace).where(
                    (StorageSpace.reconciled_at.is_(None)) | (StorageSpace.reconciled_at < stale)
                )
            )
        )
        for row in rows:
            self.reconcile(db, row)
            db.commit()
        for upload in db.scalars(select(StorageUpload).where(StorageUpload.created_at < now - 86400)):
            self.abort_upload(db, upload)
        abandoned = (StorageImport.state == "failed", StorageImport.finished_at < now - 86400)
        for imp in db.scalars(select(StorageImport).where(*abandoned, StorageImport.done_bytes > 0)):
            self.drop_import_part(db, imp)
        return len(rows)

    def drop_import_part(self, db: Session, imp: StorageImport) -> None:
        """Remove a failed import's part file: its bytes are no longer counted; a restart starts over."""
        row = db.get(StorageSpace, imp.space_id)
        if row is not None:
            self.tree(db, SpaceRef(Kind(row.kind), row.name)).drop_part(imp.id)
        imp.done_bytes = 0
        db.commit()

    def sweep_parts(self, db: Session) -> int:
        """Remove the part files that no unfinished upload or import holds (left by a server that stopped while
        it wrote one); at startup. How many were removed."""
        removed = 0
        for row in list(db.scalars(select(StorageSpace))):
            held = set(db.scalars(select(StorageUpload.id).where(StorageUpload.space_id == row.id)))
            held |= set(db.scalars(select(StorageImport.id).where(StorageImport.space_id == row.id,
                                                                  StorageImport.state != "done")))  # fmt: skip
            tree = self.tree(db, SpaceRef(Kind(row.kind), row.name))
            for part in set(tree.part_names()) - held:
                tree.drop_part(part)
                removed += 1
        return removed

    # -- changes through the platform -------------------------------------------------------------------------

    def mkdir(self, db: Session, opened: Opened, path: str, parents: bool = False) -> None:
        names = file_parts(path)
        self.reserve(db, opened.row, 0, 1)
        try:
            opened.tree.mkdir(names, parents=parents)
        except BaseException:
            self.release(db, opened.row, 0, 1)
            raise

    def delete(self, db: Session, opened: Opened, path: str) -> tuple[int, int]:
        freed = opened.tree.delete(file_parts(path))
        self.release(db, opened.row, *freed)
        return freed

    def empty(self, db: Session, opened: Opened) -> tuple[int, int]:
        """Delete everything in the space and its row (its counters, quotas, members' modes, unfinished uploads):
        the next use finds it empty, with the defaults. The caller checks that no running job mounts it, and
        commits. The bytes and entries freed."""
        for part in opened.tree.part_names():  # unfinished uploads' and imports'
            opened.tree.drop_part(part)
        freed = [0, 0]
        while True:
            page, _ = opened.tree.list((), limit=1000)
            if not page:
                break
            for entry in page:
                size, count = opened.tree.delete((entry.name,))
                freed[0], freed[1] = freed[0] + size, freed[1] + count
        db.delete(opened.row)
        return freed[0], freed[1]

    def start_upload(self, db: Session, user: User, opened: Opened, path: str, size: int) -> StorageUpload:
        names = file_parts(path)
        if size > self.settings.storage_max_upload_bytes:
            raise PathRefused(f"a file of at most {self.settings.storage_max_upload_bytes} bytes may be uploaded")
        try:
            opened.tree.stat(names)
            raise NameClash(f"{path!r} already exists")
        except NoSuchPath:
            pass
        opened.tree.stat(names[:-1])  # the folder must exist (and be a folder, reached without a link)
        self.headroom(db, opened.row, size, 1)
        upload = StorageUpload(
            id=secrets.token_hex(16),
            space_id=opened.row.id,
            user_id=user.id,
            path="/".join(names),
            size=size,
            created_at=time.time(),
        )
        opened.tree.new_part(upload.id)
        db.add(upload)
        db.commit()
        return upload

    def finish_upload(self, db: Session, opened: Opened, upload: StorageUpload) -> None:
        """The complete part becomes the file. Refused (the quota no longer has room, the name was taken since),
        the part is gone and nothing is visible."""
        try:
            self.commit_part(db, opened, upload.id, file_parts(upload.path), upload.size)
        finally:
            self.abort_upload(db, upload)

    def commit_part(
        self, db: Session, opened: Opened, part: str, names: tuple[str, ...], size: int, replaced: int | None = None
    ) -> None:
        """Count a complete part of ``size`` bytes and rename it to ``names``: a new name (a clash is refused), or
        over a file of ``replaced`` bytes (WebDAV's PUT). Not counted unless it fits the quota."""
        self.reserve(db, opened.row, size - (replaced or 0), 0 if replaced is not None else 1)
        try:
            opened.tree.finish_part(part, names, replace=replaced is not None)
        except BaseException:
            self.release(db, opened.row, size - (replaced or 0), 0 if replaced is not None else 1)
            opened.tree.drop_part(part)
            raise

    def room(self, db: Session, opened: Opened) -> int:
        """Bytes the space may still take (an import's own bytes so far are among the unfinished imports')."""
        db.refresh(opened.row)
        return self.quota(opened.row)[0] - opened.row.used_bytes - self.pending(db, opened.row)

    def abort_upload(self, db: Session, upload: StorageUpload) -> None:
        row = db.get(StorageSpace, upload.space_id)
        if row is not None:
            self.tree(db, SpaceRef(Kind(row.kind), row.name)).drop_part(upload.id)
        db.delete(upload)
        db.commit()
