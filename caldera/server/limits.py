"""Request body size limit: a declared ``Content-Length`` over the limit is refused before anything is read, and
a body without one (chunked) is counted as it streams and cut off at the limit. Either way: 413."""

from __future__ import annotations

import json
import re

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int):
        super().__init__(413, f"request body larger than {limit} bytes")


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int, larger: tuple[tuple[str, re.Pattern[str], int], ...] = ()):
        """``larger``: (method, path pattern, limit) of the routes that take more (file uploads)."""
        self.app = app
        self.max_bytes = max_bytes
        self.larger = larger

    def limit_for(self, scope: Scope) -> int:
        for method, pattern, limit in self.larger:
            if scope["method"] == method and pattern.fullmatch(scope["path"]):
                return limit
        return self.max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        max_bytes = self.limit_for(scope)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                await _answer(send, 400, "invalid Content-Length")
                return
            if int(declared) > max_bytes:
                await _answer(send, 413, BodyTooLarge(max_bytes).detail)
                return
        seen = 0
        started = False

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > max_bytes:
                    raise BodyTooLarge(max_bytes)
            return message

        async def tracking(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited, tracking)
        except BodyTooLarge as exc:  # read outside a route (a middleware); routes answer it themselves
            if started:
                raise
            await _answer(send, 413, exc.detail)


async def _answer(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
