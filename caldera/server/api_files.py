"""Storage spaces through the API (docs/storage.md): list, download, mkdir, move, delete, and resumable uploads in
the manner of tus: ``POST .../uploads`` declares a path and a size, ``PATCH .../uploads/{id}`` with an
``Upload-Offset`` header appends a chunk where the platform's copy ends (``GET`` says where that is, after an
interruption), and the last byte renames the complete file into place. Every path goes through
``caldera.storage.paths`` and ``caldera.storage.tree``."""

from __future__ import annotations

import asyncio
import errno
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field
from sqlalchemy import select
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from caldera.db.models import StorageMemberMode, StorageUpload, User
from caldera.server import audit, files
from caldera.server.deps import admin_user, current_user, db_session
from caldera.server.errors import CalderaError, Conflict, Invalid, NotFound
from caldera.server.request_body import RequestBody
from caldera.storage.errors import PathRefused
from caldera.storage.paths import MAX_PATH_CHARS, file_parts, parts
from caldera.storage.service import Opened, Spaces
from caldera.storage.spaces import Access, Kind
from caldera.storage.tree import OffsetMismatch

router = APIRouter(prefix="/api/v1", tags=["files"])
UPLOAD_CHUNK_PATH = re.compile(r"/api/v1/spaces/[^/]+/uploads/[0-9a-f]{32}")  # bodies up to storage_chunk_bytes
MAX_PAGE = 5000

SpaceName = Annotated[str, Path(max_length=80)]
UploadId = Annotated[str, Path(pattern="^[0-9a-f]{32}$")]
PathParam = Annotated[str, Query(max_length=MAX_PATH_CHARS)]


def spaces(request: Request) -> Spaces:
    return request.app.state.spaces


@contextmanager
def _fs_errors() -> Iterator[None]:
    """What the file system says (a full disk, a name too long for it) is the caller's answer, never a 500."""
    try:
        yield
    except OSError as exc:
        status = {errno.ENOSPC: 507, errno.EDQUOT: 507, errno.ENOTEMPTY: 409, errno.EEXIST: 409}.get(exc.errno, 400)
        error = CalderaError(f"the file system refused: {os.strerror(exc.errno or errno.EIO)}")
        error.status = status
        raise error from None


@dataclass
class Caller:
    """The request's user (an admin for the admins' routes), database session and spaces."""

    user: User
    db: Session
    spaces: Spaces

    def open(self, space: str, need: Access) -> Opened:
        with _fs_errors():
            return self.spaces.open(self.db, self.user, space, need)


def caller(user: User = Depends(current_user), db: Session = Depends(db_session), s: Spaces = Depends(spaces)):
    return Caller(user, db, s)


def admin_caller(admin: User = Depends(admin_user), db: Session = Depends(db_session), s: Spaces = Depends(spaces)):
    return Caller(admin, db, s)


# -- spaces ---------------------------------------------------------------------------------------------------


@router.get("/spaces")
def list_spaces(c: Caller = Depends(caller)):
    out = []
    for ref in c.spaces.visible(c.db, c.user):
        row = c.spaces.row(c.db, ref)
        out.append(c.spaces.view(ref, row, c.spaces.access_of(c.db, c.user, ref, row)))
    return out


@router.get("/spaces/{space}")
def space_info(space: SpaceName, c: Caller = Depends(caller)):
    opened = c.open(space, Access.READ)
    return c.spaces.view(opened.ref, opened.row, opened.access)


class QuotaIn(BaseModel):
    quota_bytes: int | None = Field(None, ge=0, le=2**62)
    quota_files: int | None = Field(None, ge=0, le=2**62)


@router.patch("/spaces/{space}")
def set_quota(space: SpaceName, body: QuotaIn, c: Caller = Depends(admin_caller)):
    """Admins set a space's quotas (null: the settings' default again)."""
    opened = c.open(space, Access.READ)
    for field in body.model_fields_set:
        setattr(opened.row, field, getattr(body, field))
    audit.record(c.db, c.user, "set-space-quota", str(opened.ref), body.model_dump(exclude_unset=True))
    c.db.commit()
    return c.spaces.view(opened.ref, opened.row, opened.access)


class MemberModeIn(BaseModel):
    mode: str = Field(..., pattern="^(ro|rw)$", description="ro: the member reads the account's space only")


@router.put("/spaces/{space}/members/{username}")
def set_member_mode(
    space: SpaceName,
    username: Annotated[str, Path(max_length=64)],
    body: MemberModeIn,
    c: Caller = Depends(admin_caller),
):
    opened = c.open(space, Access.READ)
    if opened.ref.kind is not Kind.ACCOUNT:
        raise Invalid("space", "only an account's space has members")
    member = c.db.scalar(select(User).where(User.username == username))
    if member is None:
        raise NotFound(f"no user {username!r}")
    row = c.db.get(StorageMemberMode, (opened.row.id, member.id))
    if row is None:
        c.db.add(StorageMemberMode(space_id=opened.row.id, user_id=member.id, mode=body.mode))
    else:
        row.mode = body.mode
    audit.record(c.db, c.user, "set-space-access", str(opened.ref), {"username": username, "mode": body.mode})
    c.db.commit()
    return {"space": str(opened.ref), "username": username, "mode": body.mode}


@router.delete("/spaces/{space}")
def delete_space(space: SpaceName, c: Caller = Depends(admin_caller)):
    """Admins empty a space: every file, its quotas and members' modes. Refused while a running job mounts it."""
    opened = c.open(space, Access.READ)
    jobs = files.running_mounts(c.db, opened.ref)
    if jobs:
        ids = ", ".join(jobs)
        raise Conflict(f"{opened.ref} is in use by running jobs {ids}: delete it once they end", "SpaceInUse",
                       {"space": str(opened.ref), "jobs": ids})  # fmt: skip
    with _fs_errors():
        size, count = c.spaces.empty(c.db, opened)
    audit.record(c.db, c.user, "delete-space", str(opened.ref), {"freed_bytes": size, "freed_files": count})
    c.db.commit()
    return {"space": str(opened.ref), "freed_bytes": size, "freed_files": count}


@router.post("/spaces/{space}/reconcile")
def reconcile(space: SpaceName, c: Caller = Depends(admin_caller)):
    """Walk the space now and set its usage from what is there (the server does it every storage_reconcile_s)."""
    opened = c.open(space, Access.READ)
    with _fs_errors():
        c.spaces.reconcile(c.db, opened.row)
    audit.record(c.db, c.user, "reconcile-space", str(opened.ref), {})
    c.db.commit()
    return c.spaces.view(opened.ref, opened.row, opened.access)


# -- files ----------------------------------------------------------------------------------------------------


@router.get("/spaces/{space}/list")
def list_folder(
    space: SpaceName,
    path: PathParam = "",
    after: Annotated[str, Query(max_length=1024)] = "",
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 1000,
    c: Caller = Depends(caller),
):
    """One page of a folder in name order; ``next`` is the ``after`` of the next page (null on the last)."""
    opened = c.open(space, Access.READ)
    with _fs_errors():
        entries, nxt = opened.tree.list(parts(path), after=after, limit=limit)
    return {
        "space": str(opened.ref),
        "path": "/".join(parts(path)),
        "entries": [{"name": e.name, "kind": e.kind, "size": e.size, "modified": e.modified} for e in entries],
        "next": nxt,
    }


@router.get("/spaces/{space}/files")
def download(space: SpaceName, path: PathParam, c: Caller = Depends(caller)):
    opened = c.open(space, Access.READ)
    names = file_parts(path)
    with _fs_errors():
        size, blocks = opened.tree.reader(names)
    return StreamingResponse(
        blocks,
        media_type="application/octet-stream",
        headers={
            "Content-Length": str(size),
            "Content-Disposition": f"attachment; filename*=UTF-8''{quote(names[-1], safe='')}",
        },
    )


class FolderIn(BaseModel):
    path: str = Field(..., max_length=MAX_PATH_CHARS)
    parents: bool = Field(False, description="make missing folders on the way too")


@router.post("/spaces/{space}/folders", status_code=201)
def mkdir(space: SpaceName, body: FolderIn, c: Caller = Depends(caller)):
    opened = c.open(space, Access.WRITE)
    with _fs_errors():
        c.spaces.mkdir(c.db, opened, body.path, parents=body.parents)
    return {"space": str(opened.ref), "path": "/".join(file_parts(body.path))}


class MoveIn(BaseModel):
    src: str = Field(..., max_length=MAX_PATH_CHARS)
    dst: str = Field(..., max_length=MAX_PATH_CHARS)


@router.post("/spaces/{space}/move")
def move(space: SpaceName, body: MoveIn, c: Caller = Depends(caller)):
    """Rename or move within the space; a name already at ``dst`` is a clash (409), never replaced."""
    opened = c.open(space, Access.WRITE)
    with _fs_errors():
        opened.tree.move(file_parts(body.src), file_parts(body.dst))
    return {"space": str(opened.ref), "src": body.src, "dst": body.dst}


@router.delete("/spaces/{space}/files")
def delete(space: SpaceName, path: PathParam, c: Caller = Depends(caller)):
    opened = c.open(space, Access.WRITE)
    with _fs_errors():
        size, count = c.spaces.delete(c.db, opened, path)
    return {"space": str(opened.ref), "freed_bytes": size, "freed_files": count}


# -- resumable uploads ----------------------------------------------------------------------------------------


class UploadIn(BaseModel):
    path: str = Field(..., max_length=MAX_PATH_CHARS)
    size: int = Field(..., ge=0, le=2**62)


def _upload_view(upload: StorageUpload, offset: int, space: str) -> dict:
    return {"id": upload.id, "space": space, "path": upload.path, "size": upload.size, "offset": offset}


@router.post("/spaces/{space}/uploads", status_code=201)
def start_upload(space: SpaceName, body: UploadIn, c: Caller = Depends(caller)):
    """Declare an upload; nothing is visible at ``path`` until its last byte arrived. With size 0 it is done."""
    opened = c.open(space, Access.WRITE)
    with _fs_errors():
        upload = c.spaces.start_upload(c.db, c.user, opened, body.path, body.size)
        out = _upload_view(upload, 0, str(opened.ref))
        if upload.size == 0:
            c.spaces.finish_upload(c.db, opened, upload)
    return {**out, "done": body.size == 0}


def _upload_of(c: Caller, space: str, upload_id: str) -> tuple[Opened, StorageUpload]:
    """The caller's own upload into a space they may still write."""
    opened = c.open(space, Access.WRITE)
    upload = c.db.get(StorageUpload, upload_id)
    if upload is None or upload.user_id != c.user.id or upload.space_id != opened.row.id:
        raise NotFound("no such upload")
    return opened, upload


@router.get("/spaces/{space}/uploads/{upload_id}")
def upload_status(space: SpaceName, upload_id: UploadId, c: Caller = Depends(caller)):
    """Where to resume: ``offset`` is how many bytes the platform has."""
    opened, upload = _upload_of(c, space, upload_id)
    with _fs_errors():
        return _upload_view(upload, opened.tree.part_size(upload.id), str(opened.ref))


@router.delete("/spaces/{space}/uploads/{upload_id}")
def abort_upload(space: SpaceName, upload_id: UploadId, c: Caller = Depends(caller)):
    _, upload = _upload_of(c, space, upload_id)
    with _fs_errors():
        c.spaces.abort_upload(c.db, upload)
    return {"id": upload_id, "aborted": True}


class OffsetConflict(Conflict):
    pass


@router.patch("/spaces/{space}/uploads/{upload_id}")
async def append_chunk(space: SpaceName, upload_id: UploadId, request: Request, c: Caller = Depends(caller)):
    """Append the body at ``Upload-Offset`` (the platform's size of the upload, else 409 saying it). A body past
    the declared size, or a space whose quota no longer has room, ends the upload and leaves nothing behind."""
    declared = request.headers.get("upload-offset", "")
    if not declared.isdigit() or len(declared) > 19:
        raise Invalid("Upload-Offset", "a header with the byte offset this chunk starts at is needed")
    offset = int(declared)
    opened, upload = await run_in_threadpool(_upload_of, c, space, upload_id)
    try:
        await run_in_threadpool(c.spaces.headroom, c.db, opened.row, upload.size, 1)
    except CalderaError:
        await run_in_threadpool(c.spaces.abort_upload, c.db, upload)
        raise
    body = RequestBody(asyncio.get_running_loop(), request.receive)
    try:
        position = await run_in_threadpool(_append, opened, upload, offset, body)
    finally:
        body.close()
    done = position == upload.size
    if done:
        with _fs_errors():
            await run_in_threadpool(c.spaces.finish_upload, c.db, opened, upload)
    return {"id": upload_id, "offset": position, "size": upload.size, "done": done}


def _append(opened: Opened, upload: StorageUpload, offset: int, body: RequestBody) -> int:
    """In a worker thread: write the body to the part as it arrives (past the page cache where it can:
    ``DirectWriter``), while the event loop receives what follows (``RequestBody``); the bytes that arrived stay
    even when the connection breaks, so the client resumes after them."""
    position = offset
    try:
        with _fs_errors(), opened.tree.part_writer(upload.id, offset) as part:
            while pieces := body.take():
                if position + sum(map(len, pieces)) > upload.size:
                    raise PathRefused(f"more bytes than the upload's declared size ({upload.size})")
                position += part.writev(pieces)
    except OffsetMismatch as exc:
        raise OffsetConflict(f"{exc}: resume from there", "UploadOffset", {"offset": exc.size}) from None
    return position
