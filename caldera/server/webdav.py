"""WebDAV at ``/dav/<space>/<path>`` (WsgiDAV, mounted in the app), so that a file manager, ``rclone`` or
``davfs2`` mounts a space. HTTP Basic with the user's name and a personal API token as the password; the same
rules, path layer (caldera.storage.tree: no link is followed) and quotas as the API. A PUT writes a part file that
replaces the old file only once complete and counted: a quota overrun leaves the old file, or nothing.

Links and other non-files a job planted are not shown; ``/dav/`` lists the spaces the user may reach.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator
from typing import Any

from sqlalchemy.orm import Session
from starlette.exceptions import HTTPException
from wsgidav.dav_error import (
    HTTP_BAD_REQUEST,
    HTTP_CONFLICT,
    HTTP_FORBIDDEN,
    HTTP_INSUFFICIENT_STORAGE,
    HTTP_NOT_FOUND,
    DAVError,
)
from wsgidav.dav_provider import DAVCollection, DAVNonCollection, DAVProvider
from wsgidav.dc.base_dc import BaseDomainController
from wsgidav.wsgidav_app import WsgiDAVApp

from caldera.db.models import User
from caldera.errors import CalderaError
from caldera.server.platform import Platform
from caldera.server.request_body import RequestBody
from caldera.server.security import PERSONAL_PREFIX
from caldera.storage.errors import NoSuchPath, QuotaExceeded
from caldera.storage.paths import parts
from caldera.storage.service import Opened, Spaces
from caldera.storage.spaces import Access
from caldera.storage.tree import Entry

MOUNT = "/dav"
ANY_PATH = re.compile(f"{MOUNT}/.*")  # PUT bodies up to storage_max_upload_bytes
_USER = "caldera.user_id"


def _dav_error(exc: CalderaError) -> DAVError:
    if isinstance(exc, QuotaExceeded):
        return DAVError(HTTP_INSUFFICIENT_STORAGE, exc.message)
    status = {403: HTTP_FORBIDDEN, 404: HTTP_NOT_FOUND, 409: HTTP_CONFLICT, 507: HTTP_INSUFFICIENT_STORAGE}
    return DAVError(status.get(exc.status, HTTP_BAD_REQUEST), exc.message)


class _Request:
    """One operation's database session and user, and the space it works in."""

    def __init__(self, provider: SpacesProvider, environ: dict):
        self.provider, self.environ = provider, environ

    def __enter__(self) -> tuple[Session, User]:
        self.db = self.provider.platform.session()
        user = self.db.get(User, self.environ[_USER])
        if user is None or not user.active:
            self.db.close()
            raise DAVError(HTTP_FORBIDDEN)
        return self.db, user

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        self.db.close()
        if isinstance(exc, CalderaError):
            raise _dav_error(exc) from None


class SpacesProvider(DAVProvider):
    def __init__(self, platform: Platform, spaces: Spaces):
        super().__init__()
        self.platform, self.spaces = platform, spaces

    def get_resource_inst(self, path: str, environ: dict) -> Any:
        request = _Request(self, environ)
        segments = [p for p in path.split("/") if p]
        if not segments:
            return Root(path, environ, request)
        with request as (db, user):
            opened = self.spaces.open(db, user, segments[0], Access.READ)
            names = parts("/".join(segments[1:]))
            try:
                entry = opened.tree.stat(names)
            except NoSuchPath:
                return None
        if entry.kind == "dir":
            return Folder(path, environ, request, segments[0], names)
        if entry.kind == "file":
            return File(path, environ, request, segments[0], names, entry)
        return None  # a link or a FIFO a job planted: not there for WebDAV


class _InSpace:
    """What folders and files share: their space, opened for each operation with the access it needs."""

    request: _Request
    space: str
    names: tuple[str, ...]

    def _open(self, db: Session, user: User, need: Access) -> Opened:
        return self.request.provider.spaces.open(db, user, self.space, need)

    def _dest(self, dest_path: str) -> tuple[str, ...]:
        segments = [p for p in dest_path.split("/") if p]
        if not segments or segments[0] != self.space:
            raise DAVError(HTTP_FORBIDDEN, "moves and copies stay inside one space")
        return parts("/".join(segments[1:]))

    def delete(self) -> None:
        with self.request as (db, user):
            self.request.provider.spaces.delete(db, self._open(db, user, Access.WRITE), "/".join(self.names))

    def support_recursive_move(self, dest_path: str) -> bool:
        return True

    def move_recursive(self, dest_path: str) -> None:
        with self.request as (db, user):
            self._open(db, user, Access.WRITE).tree.move(self.names, self._dest(dest_path))

    def support_recursive_delete(self) -> bool:
        return True


class Root(DAVCollection):
    def __init__(self, path: str, environ: dict, request: _Request):
        super().__init__(path, environ)
        self.request = request

    def get_member_names(self) -> list[str]:
        with self.request as (db, user):
            return [str(ref) for ref in self.request.provider.spaces.visible(db, user)]

    def get_member(self, name: str) -> Any:
        return self.request.provider.get_resource_inst(f"/{name}", self.environ)


class Folder(_InSpace, DAVCollection):
    def __init__(self, path: str, environ: dict, request: _Request, space: str, names: tuple[str, ...]):
        super().__init__(path, environ)
        self.request, self.space, self.names = request, space, names

    def get_member_names(self) -> list[str]:
        out: list[str] = []
        with self.request as (db, user):
            tree = self._open(db, user, Access.READ).tree
            after: str | None = ""
            while after is not None:
                page, after = tree.list(self.names, after=after)
                out += [e.name for e in page if e.kind in ("file", "dir")]
        return out

    def get_member(self, name: str) -> Any:
        return self.request.provider.get_resource_inst(f"{self.path.rstrip('/')}/{name}", self.environ)

    def create_collection(self, name: str) -> None:
        with self.request as (db, user):
            self.request.provider.spaces.mkdir(db, self._open(db, user, Access.WRITE), "/".join((*self.names, name)))

    def create_empty_resource(self, name: str) -> File:
        """Nothing is made yet: the new file appears when its PUT is complete (File.end_write)."""
        with self.request as (db, user):
            self._open(db, user, Access.WRITE)
        return File(f"{self.path.rstrip('/')}/{name}", self.environ, self.request, self.space, (*self.names, name))

    def copy_move_single(self, dest_path: str, *, is_move: bool) -> None:
        if is_move:
            raise DAVError(HTTP_FORBIDDEN)  # moves go through move_recursive
        with self.request as (db, user):
            self.request.provider.spaces.mkdir(db, self._open(db, user, Access.WRITE), "/".join(self._dest(dest_path)))


class File(_InSpace, DAVNonCollection):
    def __init__(
        self,
        path: str,
        environ: dict,
        request: _Request,
        space: str,
        names: tuple[str, ...],
        entry: Entry | None = None,
    ):
        super().__init__(path, environ)
        self.request, self.space, self.names, self.entry = request, space, names, entry

    def get_content_length(self) -> int | None:
        return self.entry.size if self.entry else 0

    def get_content_type(self) -> str:
        """Never what the name says: a member's ``evil.html`` or ``.js`` served as such from the platform's own
        origin would run there with the reader's session. Opaque bytes (with nosniff) are only ever saved."""
        return "application/octet-stream"

    def get_last_modified(self) -> float | None:
        return self.entry.modified if self.entry else None

    def get_etag(self) -> str | None:
        return f"{self.entry.modified:.6f}-{self.entry.size}" if self.entry else None

    def support_etag(self) -> bool:
        return True

    def support_ranges(self) -> bool:
        return True

    def get_content(self) -> Any:
        with self.request as (db, user):
            return self._open(db, user, Access.READ).tree.open_file(self.names)

    def begin_write(self, *, content_type: str | None = None) -> _PartWriter:
        with self.request as (db, user):
            opened = self._open(db, user, Access.WRITE)
            room = self.request.provider.spaces.room(db, opened) + (self.entry.size if self.entry else 0)
            self.writer = _PartWriter(opened, room)
        return self.writer

    def end_write(self, *, with_errors: bool) -> None:
        writer = self.writer
        if with_errors:
            writer.opened.tree.drop_part(writer.part)
            return
        with self.request as (db, user):
            opened = self._open(db, user, Access.WRITE)
            replaced = self.entry.size if self.entry else None
            self.request.provider.spaces.commit_part(db, opened, writer.part, self.names, writer.size, replaced)
            self.entry = opened.tree.stat(self.names)

    def copy_move_single(self, dest_path: str, *, is_move: bool) -> None:
        if is_move:
            raise DAVError(HTTP_FORBIDDEN)
        with self.request as (db, user):
            opened = self._open(db, user, Access.WRITE)
            writer = _PartWriter(opened, self.request.provider.spaces.room(db, opened))
            with opened.tree.open_file(self.names) as src:
                while block := src.read(1 << 20):
                    writer.write(block)
            writer.close()
            self.request.provider.spaces.commit_part(db, opened, writer.part, self._dest(dest_path), writer.size)


class _PartWriter:
    """The body of a PUT, written to a part file; past ``room`` bytes it stops with 507 and the part is dropped."""

    def __init__(self, opened: Opened, room: int):
        self.opened, self.room, self.size = opened, room, 0
        self.part = secrets.token_hex(16)
        opened.tree.new_part(self.part)
        self._cm = opened.tree.part_writer(self.part, 0)
        self._part = self._cm.__enter__()

    def write(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.room:
            self.close()
            self.opened.tree.drop_part(self.part)
            raise DAVError(HTTP_INSUFFICIENT_STORAGE, str(QuotaExceeded("the space's quota is reached")))
        self._part.write(data)

    def close(self) -> None:
        if self._cm is not None:
            self._cm.__exit__(None, None, None)
            self._cm = None


class TokenDomainController(BaseDomainController):
    """Basic auth: the user's name and one of their personal API tokens (`caldera tokens create`)."""

    def __init__(self, wsgidav_app: Any, config: dict):
        super().__init__(wsgidav_app, config)
        self.platform: Platform = config["caldera_platform"]

    def get_domain_realm(self, path_info: str, environ: dict) -> str:
        return "caldera"

    def require_authentication(self, realm: str, environ: dict) -> bool:
        return True

    def supports_http_digest_auth(self) -> bool:
        return False

    def basic_auth_user(self, realm: str, user_name: str, password: str, environ: dict) -> bool:
        from fastapi import HTTPException

        from caldera.server.deps import user_for_token

        if not password.startswith(PERSONAL_PREFIX) or len(password) > 512:
            return False
        with self.platform.session() as db:
            try:
                user = user_for_token(self.platform, db, password)
            except HTTPException:
                return False
            if user.username != user_name:
                return False
            environ[_USER] = user.id
        return True


def dav_app(platform: Platform, spaces: Spaces) -> Any:
    return _guarded(
        WsgiDAVApp(
            {
                "mount_path": MOUNT,
                "provider_mapping": {"/": SpacesProvider(platform, spaces)},
                "http_authenticator": {
                    "domain_controller": TokenDomainController,
                    "accept_basic": True,
                    "accept_digest": False,
                    "default_to_digest": False,
                    "trusted_auth_header": None,
                },
                "caldera_platform": platform,
                "property_manager": None,
                "lock_storage": True,
                "dir_browser": {"enable": False},
                # bytes per read of a GET or PUT body: WsgiDAV's 8 KiB made each block a trip through the WSGI
                # bridge's thread, and a download ran at a tenth of the API's speed
                "block_size": 1 << 20,
                "logging": {"enable": False},
                "verbose": 0,
            }
        )
    )


class _Body(RequestBody):
    def take(self) -> list[bytes]:
        try:
            return super().take()
        except HTTPException as exc:  # the size limit: its own status, where WsgiDAV would say 500
            raise DAVError(exc.status_code, exc.detail) from None


def _guarded(app: Any) -> Any:
    """A PROPFIND of unbounded depth (the default when no Depth is sent) would walk a whole space in one request:
    refused, as RFC 4918 allows; clients list one level at a time. Every answer is sandboxed: nothing under /dav
    runs as a page of the platform. The body is read through caldera.server.request_body (received ahead of the
    thread that writes it), and no longer received once the answer is sent."""

    def guarded(environ: dict, start_response: Any) -> Iterator[bytes]:
        if environ["REQUEST_METHOD"] == "PROPFIND" and environ.get("HTTP_DEPTH", "infinity").lower() == "infinity":
            start_response("403 Forbidden", [("Content-Type", "text/plain; charset=utf-8")])
            yield b"PROPFIND with Depth: infinity is not served; ask for Depth: 0 or 1\n"
            return

        def sandboxed(status: str, headers: list, exc_info: Any = None) -> Any:
            headers = [(k, v) for k, v in headers if k.lower() != "content-security-policy"]
            headers.append(("Content-Security-Policy", "sandbox; default-src 'none'"))
            return start_response(status, headers, exc_info)

        a2wsgi_body = environ["wsgi.input"]  # nothing read from it yet; its loop and receive are a2wsgi's own
        body = environ["wsgi.input"] = _Body(a2wsgi_body.loop, a2wsgi_body.receive)
        answer = app(environ, sandboxed)
        try:
            yield from answer
        finally:
            body.close()
            if hasattr(answer, "close"):
                answer.close()  # WSGI's rule, which a2wsgi keeps for the iterable it is given: this one

    return guarded
