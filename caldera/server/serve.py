"""Run the platform's origin and the lab origin together: two servers, one process, one platform."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterator
from typing import Any

import uvicorn

from caldera.config import Settings
from caldera.server.app import create_app
from caldera.server.lab_app import create_lab_app
from caldera.server.platform import Platform


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # serve() below stops both servers on one signal


def proxy_options(s: Settings) -> dict[str, Any]:
    """uvicorn believes X-Forwarded-For from 127.0.0.1 unless told otherwise, and every local process (each job of
    the process runtime) connects from there: only the proxies an admin configured are believed, none by default."""
    return {"proxy_headers": bool(s.trusted_proxies), "forwarded_allow_ips": list(s.trusted_proxies)}


def serve(platform: Platform) -> None:
    s = platform.settings
    servers = [
        _Server(uvicorn.Config(app, host=s.host, port=port, log_level="warning", **proxy_options(s)))
        for app, port in ((create_app(platform), s.port), (create_lab_app(platform), s.lab_bind_port))
    ]

    def stop(*_: object) -> None:
        for server in servers:
            server.should_exit = True

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)

    async def both() -> None:
        await asyncio.gather(*(server.serve() for server in servers))

    asyncio.run(both())
