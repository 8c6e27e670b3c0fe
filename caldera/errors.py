"""Domain errors the API turns into HTTP answers."""

from __future__ import annotations

from typing import Any


class CalderaError(Exception):
    """``message`` is the API's English; ``code`` and ``params``, where given, let the portal say the same in its
    reader's language (caldera/server/web/reason_text.py)."""

    status = 400

    def __init__(self, message: str, code: str = "", params: dict[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.params = params


class NotFound(CalderaError):
    status = 404


class Conflict(CalderaError):
    status = 409


class Unavailable(CalderaError):
    """Something the platform depends on (a cluster's API server) refused or did not answer."""

    status = 502


class Forbidden(CalderaError):
    status = 403


class InvalidFields(CalderaError):
    """Bad input: each error names the field and the reason."""

    status = 400

    def __init__(self, errors: list[dict[str, Any]]):
        super().__init__("; ".join(f"{e['field']}: {e['reason']}" for e in errors))
        self.errors = errors


def field_error(field: str, reason: str, code: str = "", params: dict[str, Any] | None = None) -> dict[str, Any]:
    """One row of an InvalidFields: ``code`` and ``params`` are added only where given (the API's JSON too)."""
    return {"field": field, "reason": reason, **({"code": code, "params": params or {}} if code else {})}


class Invalid(InvalidFields):
    def __init__(self, field: str, reason: str, code: str = "", params: dict[str, Any] | None = None):
        super().__init__([field_error(field, reason, code, params)])
