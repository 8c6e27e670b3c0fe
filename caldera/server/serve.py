"""Run the platform's origin and the lab origin together: two servers, one process, one platform."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterator

import uvicorn

from caldera.server.app import create_app
from caldera.server.lab_app import create_lab_app
from caldera.server.platform import Platform


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # serve() below stops both servers on one signal


def serve(platform: Platform) -> None:
    s = platform.settings
    servers = [
        _Server(uvicorn.Config(create_app(platform), host=s.host, port=s.port, log_level="warning")),
        _Server(uvicorn.Config(create_lab_app(platform), host=s.host, port=s.lab_bind_port, log_level="warning")),
    ]

    def stop(*_: object) -> None:
        for server in servers:
            server.should_exit = True

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)

    async def both() -> None:
        await asyncio.gather(*(server.serve() for server in servers))

    asyncio.run(both())
