"""A request's body for a thread that writes it to a file, received ahead on the event loop meanwhile: a WebDAV
PUT (``wsgi.input``, in place of a2wsgi's) and an API upload chunk.

uvicorn stops reading a connection once 64 KiB of a body wait to be taken, until the application asks for them.
a2wsgi's ``wsgi.input`` asked the loop for each piece (a quarter mebibyte at most) while the thread waited, then
copied each byte three more times (into its buffer, a slice, ``bytes``): a PUT of 2 GiB ran at a third of a local
copy's speed. The API's upload asked the loop for 8 MiB at a time, and receiving and writing took turns. Here a task
on the loop receives the body ahead of the thread (up to ``AHEAD`` bytes), so the socket is read while the thread
writes, and the thread takes all that arrived in one trip to the loop.

A client that goes away before its body is complete is an error (a2wsgi read that as the end of the body: the
part of a file received replaced the file); so is what ``receive`` raises (the body size limit). The pieces that
arrived before it are taken first: an upload chunk keeps them, for the client to resume after."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

# bytes received that the thread has not taken yet, at most (plus one piece); as much again taken. 16 MiB ran no
# faster for a WebDAV PUT and slower for an API upload (436 against 379 MiB/s: docs/storage.md)
AHEAD = 4 << 20


class RequestBody:
    """The body ``receive`` gives on ``loop``, for a thread: ``take`` (the pieces as received) or ``read``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, receive: Any):
        self._loop, self._receive = loop, receive
        self._taken: deque[memoryview] = deque()  # the thread's: what read() has not returned yet
        self._finished: bool | BaseException = False  # the end of the body, once the thread took it
        # the loop's:
        self._arrived: list[bytes] = []
        self._arrived_bytes = 0
        self._end: bool | BaseException = False  # True: the whole body arrived
        self._news = asyncio.Event()  # something arrived, or the end
        self._room = asyncio.Event()  # the thread took what had arrived
        self._task: asyncio.Task | None = None

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
        except Exception as exc:  # noqa: BLE001 - raised in the thread that takes (BodyTooLarge: the size limit)
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

    def take(self) -> list[bytes]:
        """In the thread: all the pieces that arrived (waiting for one), as received; [] at the end of the body. The
        pieces that arrived before an error come first (an upload keeps them), the error on the next call."""
        if self._finished is False:
            pieces, self._finished = asyncio.run_coroutine_threadsafe(self._take(), self._loop).result()
            if pieces:
                return pieces
        if isinstance(self._finished, BaseException):
            raise self._finished
        return []

    def read(self, size: int = -1) -> bytes:
        """``size`` bytes (all that is left when -1), fewer only at the end of the body; the pieces joined once."""
        out: list[memoryview] = []
        wanted = size
        while wanted:
            if not self._taken:
                pieces = self.take()
                if not pieces:
                    break
                self._taken.extend(map(memoryview, pieces))
            piece = self._taken.popleft()
            if 0 <= wanted < len(piece):
                self._taken.appendleft(piece[wanted:])
                piece = piece[:wanted]
            out.append(piece)
            wanted -= len(piece)
        return b"".join(out)

    def close(self) -> None:
        """The request is answered: stop receiving its body (what was left unread, an upload refused midway)."""
        if self._task is not None:
            self._loop.call_soon_threadsafe(self._task.cancel)
