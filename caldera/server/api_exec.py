"""A command, or a shell on a terminal, inside a running job of mine: ``/api/v1/jobs/<id>/exec``, a websocket.

Who: the job's owner only (anyone else, an admin too, gets 404: a terminal acts as the job's user). Credentials are
the platform's: a bearer token (the CLI) or the session cookie (the job page). A handshake that names an Origin
must name the platform's own (never a lab's: a lab page must not reach its owner's terminals); a cookie without
an Origin is refused, and a cookie must come with the page's CSRF token in the first message too.

Protocol, after the handshake:

* the client's first message (text, JSON): ``{"argv": [...], "rank": 0, "tty": false, "rows": 24, "cols": 80,
  "term": "xterm", "csrf": "..."}``;
* then binary messages are the command's input; text messages ``{"resize": [rows, cols]}`` or ``{"eof": true}``;
* the server sends binary messages, the first byte the stream (1 stdout, 2 stderr; a terminal has only 1) and the
  rest its bytes, and at the end one text message ``{"exit": code}`` or ``{"error": code, "message": ...}``.

The session ends when the command does, when the client goes, or when the job leaves Running.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import threading
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, HTTPException, WebSocket
from fastapi.responses import JSONResponse
from starlette.websockets import WebSocketDisconnect

from caldera.core.spec import MAX_COMMAND_ARGS, MAX_COMMAND_CHARS
from caldera.core.states import JobState
from caldera.db.models import Job
from caldera.runtime.base import ExecError, Handle
from caldera.runtime.exec_process import PIPE_BYTES, ExecProcess
from caldera.server.csrf import CSRF_COOKIE, origin_of, platform_origin
from caldera.server.deps import SESSION_COOKIE, user_for_token
from caldera.server.platform import Platform

router = APIRouter(tags=["jobs"])

_ = str  # marks msgids for extraction (babel.cfg); the job page translates them by code
MESSAGES = {
    "NotRunning": _("the job is not running"),
    "NoSuchRank": _("no such rank in this job"),
    "NotSupported": _("this runtime cannot run commands in a job"),
    "StartFailed": _("the command could not be started"),
    "BadRequest": _("the request to start a command is not valid"),
    "TooMany": _("too many terminals open"),
    "JobEnded": _("the job ended"),
}
MAX_SESSIONS_PER_USER = 16
_MAX_FIRST_MESSAGE = 2 * MAX_COMMAND_CHARS
_WATCH_S = 1.0  # how often a session looks whether its job still runs
_BULK = 16 << 10  # a read this large is part of a bulk stream: what follows it soon goes in the same message
_BATCH_WAIT_S = 0.002
_open: Counter[int] = Counter()
_open_lock = threading.Lock()


@dataclass(frozen=True)
class Target:
    user_id: int
    by_cookie: bool
    job_id: str
    attempt: int
    runtime: str | None
    handle: dict[str, Any]
    world_size: int


class Refused(Exception):
    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


def authorise(p: Platform, ws: WebSocket, job_id: str, cookie: bool = True) -> Target:
    """The owner's running job, or Refused. ``cookie``: whether the browser's session cookie counts (the page's
    terminal); without it only a bearer token does."""
    auth = ws.headers.get("authorization", "")
    bearer = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
    token = bearer or (ws.cookies.get(SESSION_COOKIE, "") if cookie else "")
    if not token:
        raise Refused(401, "not authenticated")
    origin = ws.headers.get("origin")
    if origin is not None:
        s = p.settings
        if not platform_origin(origin_of(origin), origin_of(s.url), s.lab_url_template, ws.headers.get("host", ""),
                               "https" if ws.url.scheme == "wss" else "http"):  # fmt: skip
            raise Refused(403, "cross-origin terminal refused")
    elif not bearer:
        raise Refused(403, "a browser's terminal must name its Origin")
    with p.session() as db:
        try:
            user = user_for_token(p, db, token)
        except HTTPException as exc:
            raise Refused(exc.status_code, str(exc.detail)) from None
        job = db.get(Job, job_id)
        if job is None or job.user_id != user.id:
            raise Refused(404, f"no job {job_id!r}")
        if job.state != JobState.RUNNING.value or not job.handle:
            raise Refused(409, f"job {job_id} is {job.state}, not running")
        spec = job.spec or {}
        world = spec.get("replicas", 1) * spec.get("procs_per_replica", 1)
        return Target(user.id, not bearer, job.id, job.attempt, job.runtime, dict(job.handle), world)


def _still_running(p: Platform, t: Target) -> bool:
    with p.session() as db:
        job = db.get(Job, t.job_id)
        return job is not None and job.state == JobState.RUNNING.value and job.attempt == t.attempt


def _request(text: str | None, t: Target, ws: WebSocket) -> dict[str, Any]:
    """The first message, checked: a command (argv as the job spec's limits allow), a rank, a terminal."""
    if text is None or len(text) > _MAX_FIRST_MESSAGE:
        raise ValueError("the first message is a JSON object")
    req = json.loads(text)
    argv = req.get("argv")
    if not isinstance(argv, list) or not 0 < len(argv) <= MAX_COMMAND_ARGS:
        raise ValueError(f"argv: a list of 1 to {MAX_COMMAND_ARGS} strings")
    if not all(isinstance(a, str) and "\0" not in a for a in argv) or sum(map(len, argv)) > MAX_COMMAND_CHARS:
        raise ValueError(f"argv: strings without NUL, {MAX_COMMAND_CHARS} characters in all at most")
    rank, rows, cols = req.get("rank", 0), req.get("rows", 24), req.get("cols", 80)
    for name, value, top in (("rank", rank, t.world_size - 1), ("rows", rows, 1000), ("cols", cols, 1000)):
        if type(value) is not int or not (0 if name == "rank" else 1) <= value <= top:
            raise ValueError(f"{name}: out of range")
    if t.by_cookie:
        expected, presented = ws.cookies.get(CSRF_COOKIE, ""), req.get("csrf", "")
        if not (expected and isinstance(presented, str) and hmac.compare_digest(expected, presented)):
            raise PermissionError("no matching CSRF token")
    term = req.get("term", "")
    return {"argv": argv, "rank": rank, "tty": req.get("tty") is True, "rows": rows, "cols": cols,
            "term": term if isinstance(term, str) else ""}  # fmt: skip


@router.websocket("/api/v1/jobs/{job_id}/exec")
async def exec_ws(websocket: WebSocket, job_id: str) -> None:
    p: Platform = websocket.app.state.platform
    try:
        target = await asyncio.to_thread(authorise, p, websocket, job_id[:200])
    except Refused as exc:
        await deny(websocket, exc.status, exc.detail)
        return
    async with counted(websocket, target) as admitted:
        if admitted:
            await websocket.accept()
            await _session(p, websocket, target)


@asynccontextmanager
async def counted(websocket: WebSocket, target: Target) -> AsyncIterator[bool]:
    """A session of the user's while there are fewer than MAX_SESSIONS_PER_USER (else refused with 429)."""
    with _open_lock:
        admitted = _open[target.user_id] < MAX_SESSIONS_PER_USER
        if admitted:
            _open[target.user_id] += 1
    if not admitted:
        await deny(websocket, 429, MESSAGES["TooMany"])
    try:
        yield admitted
    except WebSocketDisconnect:
        pass
    finally:
        if admitted:
            with _open_lock:
                _open[target.user_id] -= 1


async def deny(websocket: WebSocket, status: int, detail: str) -> None:
    try:
        await websocket.send_denial_response(JSONResponse({"detail": detail}, status_code=status))
    except RuntimeError:  # a server without the denial extension: a plain refusal
        await websocket.close(code=1008)


async def _session(p: Platform, websocket: WebSocket, t: Target) -> None:
    first = await websocket.receive()
    try:
        req = _request(first.get("text"), t, websocket)
    except PermissionError as exc:
        await _end(websocket, {"error": "Forbidden", "message": str(exc)}, code=4403)
        return
    except (ValueError, AttributeError) as exc:
        await _end(websocket, {"error": "BadRequest", "message": str(exc)[:300]}, code=4400)
        return
    runtime = p.runtime_of(t.runtime, t.handle)
    handle = Handle(t.job_id, t.attempt, t.handle)
    try:
        proc = await asyncio.to_thread(runtime.exec, handle, req["rank"], req["argv"], req["tty"], req["term"])
    except ExecError as exc:
        await _end(websocket, {"error": exc.reason, "message": str(exc)}, code=4409)
        return
    if req["tty"]:
        proc.resize(req["rows"], req["cols"])
    pumps = [asyncio.create_task(output(websocket, proc, fd, bytes([stream]))) for stream, fd in proc.outputs()]
    inbound = asyncio.create_task(pump_input(websocket, proc))
    watch = asyncio.create_task(watch_job(p, t, proc))
    try:
        await asyncio.gather(*pumps)  # every output ended: the command has, or has closed them
        code = await asyncio.to_thread(proc.wait)
        ended = watch.done()
        await _end(websocket, {"error": "JobEnded", "message": MESSAGES["JobEnded"]} if ended else {"exit": code})
    except (WebSocketDisconnect, RuntimeError, OSError):
        pass
    finally:
        for task in (*pumps, inbound, watch):
            task.cancel()
        proc.kill()
        await asyncio.to_thread(proc.wait)
        proc.close()


async def output(websocket: WebSocket, proc: ExecProcess, fd: int, head: bytes) -> None:
    """What the command writes on ``fd``, to the client, each message ``head`` and a chunk, until its end."""
    loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)
    while True:
        ready: asyncio.Future[None] = loop.create_future()
        loop.add_reader(fd, _wake, ready)
        try:
            await ready
        finally:
            loop.remove_reader(fd)
        try:
            chunk = proc.read(fd)
        except BlockingIOError:
            continue
        if not chunk:
            return
        if len(chunk) >= _BULK:
            chunk = await _batch(fd, chunk)
        await websocket.send_bytes(head + chunk)  # waits while the client is slow: the command waits too


async def _batch(fd: int, chunk: bytes) -> bytes:
    """``chunk`` and what follows it on ``fd`` within ``_BATCH_WAIT_S``, up to a pipe's worth: a bulk stream (scp
    through SSH, whose packets are 32 KiB) in fewer, larger messages, each costing CPU here and in the client."""
    loop = asyncio.get_running_loop()
    parts, size, deadline = [chunk], len(chunk), loop.time() + _BATCH_WAIT_S
    while size < PIPE_BYTES:
        try:
            more = os.read(fd, PIPE_BYTES - size)
        except BlockingIOError:
            ready: asyncio.Future[None] = loop.create_future()
            loop.add_reader(fd, _wake, ready)
            try:
                await asyncio.wait_for(ready, deadline - loop.time())
            except TimeoutError:
                break
            finally:
                loop.remove_reader(fd)
            continue
        except OSError:  # the end (a PTY's EIO): the next read says so
            break
        if not more:
            break
        parts.append(more)
        size += len(more)
    return b"".join(parts)


def _wake(ready: asyncio.Future[None]) -> None:
    if not ready.done():
        ready.set_result(None)


async def _write(fd: int, data: bytes) -> None:
    """All of ``data`` to the command, waiting (not blocking the loop) while its input is full."""
    loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:
            ready: asyncio.Future[None] = loop.create_future()
            loop.add_writer(fd, _wake, ready)
            try:
                await ready
            finally:
                loop.remove_writer(fd)


async def pump_input(websocket: WebSocket, proc: ExecProcess) -> None:
    """The client's messages until it goes; then the command is killed (``_session``'s finally)."""
    try:
        while True:
            msg = await websocket.receive()
            if msg["type"] == "websocket.disconnect":
                break
            if msg.get("bytes"):
                await _write(proc.input_fd, msg["bytes"])
            elif msg.get("text"):
                control = json.loads(msg["text"])
                size = control.get("resize") if isinstance(control, dict) else None
                if isinstance(size, list) and len(size) == 2 and all(type(v) is int and 0 < v <= 1000 for v in size):
                    proc.resize(*size)
                elif isinstance(control, dict) and control.get("eof") is True:
                    await asyncio.to_thread(proc.close_input)
    except (WebSocketDisconnect, ValueError, OSError, RuntimeError):
        pass
    proc.kill()


async def watch_job(p: Platform, t: Target, proc: ExecProcess) -> None:
    """Ends the command once its job is no longer Running (a runtime whose namespaces end with the job ends it
    sooner)."""
    while await asyncio.to_thread(_still_running, p, t):
        await asyncio.sleep(_WATCH_S)
    proc.kill()


async def _end(websocket: WebSocket, message: dict[str, Any], code: int = 1000) -> None:
    try:
        await websocket.send_text(json.dumps(message))
        await websocket.close(code=code)
    except (WebSocketDisconnect, RuntimeError):
        pass
