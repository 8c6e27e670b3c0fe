"""The file browser: my storage spaces with their usage, and a space's folders a page at a time, with new folder,
move or rename, delete, download and (static/file_upload.js) resumable uploads through the API. Every rule is the API's
(caldera/server/api_files.py); a space the user may not read is a page that does not exist."""

from __future__ import annotations

import re
from contextlib import closing
from dataclasses import dataclass
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Form, Query, Request
from fastapi.responses import RedirectResponse, Response
from sqlalchemy.orm import Session

from caldera.db.models import User
from caldera.errors import CalderaError, NotFound
from caldera.server import api_catalogue, api_files
from caldera.server.deps import db_session, platform
from caldera.server.platform import Platform
from caldera.server.web import api_call
from caldera.server.web.render import page
from caldera.server.web.session import PageNotFound, page_user
from caldera.storage.errors import NoAccess, NoSuchPath, PathRefused
from caldera.storage.paths import MAX_PATH_CHARS, file_parts
from caldera.storage.spaces import Access

router = APIRouter(include_in_schema=False)
PAGE_SIZE = 50
PREVIEW_BYTES = 256 << 10  # a text file's preview: its start
# images shown inline, by the name's ending: an allowlist of types no browser runs as a document (no SVG, no HTML)
IMAGE_TYPES = {"png": "image/png", "jpg": "image/jpeg", "jpeg": "image/jpeg", "gif": "image/gif", "webp": "image/webp"}
IMAGE_BYTES = 20 << 20
IMPORT_ID = re.compile(r"[0-9a-f]{32}")


def page_caller(request: Request, user: User, db: Session) -> api_files.Caller:
    """The API's caller for a page's user: the same checks as the API's routes."""
    return api_files.Caller(user, db, request.app.state.spaces)


def readable(c: api_files.Caller, space: str):
    """The space opened for reading, or no page: another user's space is as if it did not exist."""
    try:
        return c.open(space, Access.READ)
    except (NoAccess, NoSuchPath, PathRefused):
        raise PageNotFound() from None


@dataclass
class FileAt:
    """A file of a space the request names, and who asks."""

    c: api_files.Caller
    space: str
    path: str


def file_at(
    request: Request,
    space: str,
    path: str = Query(..., max_length=MAX_PATH_CHARS),
    user: User = Depends(page_user),
    db: Session = Depends(db_session),
) -> FileAt:
    return FileAt(page_caller(request, user, db), space[:80], path)


@router.get("/files")
def spaces(request: Request, user: User = Depends(page_user), db: Session = Depends(db_session)):
    c = page_caller(request, user, db)
    return page(request, "files.html", user=user, spaces=api_files.list_spaces(c))


def folder_url(space: str, path: str, **more: str) -> str:
    return f"/files/{space}?" + urlencode({"path": path, **more}) if path or more else f"/files/{space}"


def import_view(c: api_files.Caller, import_id: str) -> dict | None:
    """My import's state and progress as the API gives it; None for an id that is not one of mine."""
    if not IMPORT_ID.fullmatch(import_id):
        return None
    try:
        return api_catalogue.import_status(import_id, c)
    except NotFound:
        return None


def folder_page(request: Request, p: Platform, c: api_files.Caller, space: str, path: str, after: str,
                errors=(), status=200, imported: str = "", values: dict | None = None):  # fmt: skip
    """The folder's page: with ``imported`` (an import's id), that import's progress above its entries; ``values``: a
    refused form's, shown again."""
    opened = readable(c, space)
    try:
        listed = api_files.list_folder(space, path, after, PAGE_SIZE, c)
    except NoSuchPath:
        raise PageNotFound() from None
    names = listed["path"].split("/") if listed["path"] else []
    crumbs = [(n, "/".join(names[: i + 1])) for i, n in enumerate(names)]
    return page(
        request, "files_space.html", status=status, user=c.user, errors=list(errors), space=str(opened.ref),
        info=c.spaces.view(opened.ref, opened.row, opened.access), path=listed["path"], crumbs=crumbs,
        entries=listed["entries"], next_after=listed["next"], after=after, folder_url=folder_url,
        chunk_bytes=p.settings.storage_chunk_bytes, writable=opened.access >= Access.WRITE,
        imp=import_view(c, imported) if imported else None, values=values or {},
        hf_mirror=bool(p.settings.huggingface_mirror_url),
    )  # fmt: skip


@router.get("/files/{space}")
def folder(
    request: Request,
    space: str,
    path: str = Query("", max_length=MAX_PATH_CHARS),
    after: str = Query("", max_length=1024),
    imported: str = Query("", max_length=32),
    user: User = Depends(page_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
):
    return folder_page(request, p, page_caller(request, user, db), space[:80], path, after, imported=imported)


@router.get("/files/{space}/download")
def download(at: FileAt = Depends(file_at)):
    readable(at.c, at.space)
    try:
        return api_files.download(at.space, at.path, at.c)
    except (NoSuchPath, PathRefused):
        raise PageNotFound() from None


def _parent(path: str) -> str:
    """The folder to go back to (the API judges the path itself)."""
    return path.strip("/").rpartition("/")[0]


def _write(request: Request, p: Platform, c: api_files.Caller, space: str, back_to: str, fn, *args):
    """A form's change through the API, back to the folder; the API's refusal shown on it."""
    readable(c, space)
    _, errors = api_call.call(c.db, fn, space, *args, c)
    if errors:
        return folder_page(request, p, c, space, back_to, "", errors, status=400)
    return RedirectResponse(folder_url(space, back_to), 303)


@router.post("/files/{space}/folders")
def new_folder(
    request: Request,
    space: str,
    folder: str = Form("", max_length=MAX_PATH_CHARS),
    name: str = Form(..., max_length=255),
    user: User = Depends(page_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
):
    """``name`` in the folder shown (the API refuses a name with a slash, .. or NUL as any path)."""
    body = api_files.FolderIn(path=f"{folder}/{name}" if folder else name)
    return _write(request, p, page_caller(request, user, db), space[:80], folder, api_files.mkdir, body)


@router.post("/files/{space}/delete")
def delete(
    request: Request,
    space: str,
    path: str = Form(..., max_length=MAX_PATH_CHARS),
    user: User = Depends(page_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
):
    return _write(request, p, page_caller(request, user, db), space[:80], _parent(path), api_files.delete, path)


@router.post("/files/{space}/move")
def move(
    request: Request,
    space: str,
    path: str = Form(..., max_length=MAX_PATH_CHARS),
    to: str = Form(..., max_length=MAX_PATH_CHARS),
    user: User = Depends(page_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
):
    """Rename or move ``path`` to ``to`` (a path in the same space, as the API's move); back to its folder."""
    body = api_files.MoveIn(src=path, dst=to)
    return _write(request, p, page_caller(request, user, db), space[:80], _parent(path), api_files.move, body)


def _start_of(at: FileAt, limit: int) -> tuple[int, bytes]:
    """The file's size and its first ``limit`` bytes (read no further); no page for what is not a readable file."""
    opened = readable(at.c, at.space)
    try:
        size, blocks = opened.tree.reader(file_parts(at.path))
    except (CalderaError, OSError):  # a folder, a link out, a name the file system refuses
        raise PageNotFound() from None
    data = bytearray()
    with closing(blocks):
        while len(data) < limit and (block := next(blocks, b"")):
            data += block
    return size, bytes(data[:limit])


def _image_type(path: str) -> str | None:
    return IMAGE_TYPES.get(path.rpartition(".")[2].lower())


@router.get("/files/{space}/preview")
def preview(request: Request, at: FileAt = Depends(file_at)):
    """A text file's start as text (escaped like any page text), an image as an image, anything else: download."""
    path = at.path
    size, start = _start_of(at, 0 if _image_type(path) else PREVIEW_BYTES)
    text = None
    if not _image_type(path):
        try:  # a multi-byte character cut at the limit is not binary
            text = start.decode("utf-8") if size <= PREVIEW_BYTES else start.decode("utf-8", "ignore")
        except UnicodeDecodeError:
            text = None
        text = None if text is not None and "\x00" in text else text
    return page(
        request, "files_preview.html", user=at.c.user, space=at.space, path=path.strip("/"), size=size, text=text,
        cut=size > PREVIEW_BYTES, image=_image_type(path) is not None and size <= IMAGE_BYTES, folder_url=folder_url,
        parent=_parent(path),
    )  # fmt: skip


@router.get("/files/{space}/image")
def image(at: FileAt = Depends(file_at)):
    """An image of the allowlist, inline, under a policy that runs nothing (sandboxed, no sniffing)."""
    kind = _image_type(at.path)
    if kind is None:
        raise PageNotFound()
    size, data = _start_of(at, IMAGE_BYTES + 1)
    if size > IMAGE_BYTES:
        raise PageNotFound()
    return Response(data, media_type=kind, headers={
        "X-Content-Type-Options": "nosniff", "Content-Security-Policy": "default-src 'none'; sandbox",
        "Content-Disposition": "inline", "Cache-Control": "no-store",
    })  # fmt: skip
