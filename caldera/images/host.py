"""What the image builds and snapshots need of whoever runs them: the settings and a database session. The server's
Platform is one (it composes this package); the package never imports the server."""

from __future__ import annotations

from typing import Protocol

from sqlalchemy.orm import Session

from caldera.config import Settings


class Host(Protocol):
    settings: Settings

    def session(self) -> Session: ...
