"""The body of a WebDAV request as WsgiDAV reads it (``wsgi.input``), in place of a2wsgi's.

a2wsgi's ``wsgi.input`` asks the event loop for each piece uvicorn received (a quarter mebibyte at most) while
WsgiDAV's thread waits, and uvicorn stops reading the socket until that piece is taken; then it copies each byte
three more times (into its buffer, a slice, ``bytes``). A PUT of 2 GiB ran at a third of a local copy's speed.
Here a task on the event loop receives the body ahead of the thread (up to ``AHEAD`` bytes), so the socket is
read while the thread writes the file, and the thread takes all that arrived in one trip to the loop; a read
joins what it returns from the pieces received (one copy).

A client that goes away before its body is complete is an error (a2wsgi read that as the end of the body: the
part of a file received would have replaced the file); so is what ``receive`` raises (the body size limit, a 413).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

from starlette.exceptions import HTTPException
from wsgidav.dav_error import DAVError

AHEAD = 16 << 20  # bytes received that the thread has not taken yet, at most (plus one piece); as much again taken


class RequestBody:
    """``wsgi.input`` with only ``read`` (WsgiDAV reads no other way), fed by ``receive`` on ``loop``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, receive: Any):
        self._loop, self._receive = loop, receive
        self._taken: deque[memoryview] = deque()  # the thread's: received, not read yet
        self._finished = False
        # the loop's:
        self._arrived: list[bytes] = []
        self._arrived_bytes = 0
        self._end: bool | BaseException = False  # True: the whole body arrived
        self._news = asyncio.Event()  # something arrived, or the end
        self._room = asyncio.Event()  # the thread took what had arrived
        self._task: asyncio.Task | None = None

    @classmethod
    def replacing(cls, a2wsgi_body: Any) -> RequestBody:
        """In place of a2wsgi's ``wsgi.input``, with its loop and ``receive``, before anything read from it."""
        return cls(a2wsgi_body.loop, a2wsgi_body.receive)

    async def _receive_ahead(self) -> None:
        try:
            while True:
                while self._arrived_bytes >= AHEAD:
                    self._room.clear()
                    await self._room.wait()
                message = await self._receive()
                if message["type"] != "http.request":
                    self._end = ConnectionResetError("the client went away before the request's body was complete")
                    return
                if body := message.get("body"):
                    self._arrived.append(body)
                    self._arrived_bytes += len(body)
                    self._news.set()
                if not message.get("more_body", False):
                    self._end = True
                    return
        except asyncio.CancelledError:
            self._end = ConnectionResetError("the request ended before its body was read")
            raise
        except Exception as exc:  # noqa: BLE001 - raised in the thread that reads (BodyTooLarge: the size limit)
            self._end = exc
        finally:
            self._news.set()

    async def _take(self) -> tuple[list[bytes], bool | BaseException]:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._receive_ahead())
        while not self._arrived and self._end is False:
            self._news.clear()
            await self._news.wait()
        pieces, self._arrived, self._arrived_bytes = self._arrived, [], 0
        self._room.set()
        return pieces, self._end

    def _fill(self) -> bool:
        """In the thread: take all that arrived (waiting for something); False at the end of the body."""
        if self._finished:
            return False
        pieces, end = asyncio.run_coroutine_threadsafe(self._take(), self._loop).result()
        if isinstance(end, HTTPException):  # the size limit: its own status, where WsgiDAV would say 500
            raise DAVError(end.status_code, end.detail)
        if isinstance(end, BaseException):
            raise end
        self._taken.extend(map(memoryview, pieces))
        self._finished = end
        return bool(pieces) or not end

    def read(self, size: int = -1) -> bytes:
        """``size`` bytes (all that is left when -1), fewer only at the end of the body."""
        out: list[memoryview] = []
        wanted = size
        while wanted and (self._taken or self._fill()):
            piece = self._taken.popleft()
            if 0 <= wanted < len(piece):
                self._taken.appendleft(piece[wanted:])
                piece = piece[:wanted]
            out.append(piece)
            wanted -= len(piece)
        return b"".join(out)

    def close(self) -> None:
        """The request is answered: stop receiving its body (what WsgiDAV left unread, a PUT refused midway)."""
        if self._task is not None:
            self._loop.call_soon_threadsafe(self._task.cancel)
