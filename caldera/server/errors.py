"""Domain errors the API turns into HTTP answers."""

from __future__ import annotations


class CalderaError(Exception):
    status = 400

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


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

    def __init__(self, errors: list[dict[str, str]]):
        super().__init__("; ".join(f"{e['field']}: {e['reason']}" for e in errors))
        self.errors = errors


class Invalid(InvalidFields):
    def __init__(self, field: str, reason: str):
        super().__init__([{"field": field, "reason": reason}])
