"""The refusals storage gives, each an API answer with its reason (caldera.errors)."""

from __future__ import annotations

from caldera.errors import CalderaError, Conflict, Forbidden, Invalid, NotFound


class PathRefused(Invalid):
    def __init__(self, reason: str):
        super().__init__("path", reason)


class NoSuchPath(NotFound):
    pass


class NameClash(Conflict):
    pass


class NoAccess(Forbidden):
    pass


class QuotaExceeded(CalderaError):
    status = 507  # Insufficient Storage
