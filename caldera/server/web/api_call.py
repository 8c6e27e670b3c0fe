"""The one way a form route calls the API: its result, or the API's errors as (field, reason) rows for the page,
whichever of the API's error types was raised; a refused call leaves nothing half-written (rollback)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import ValidationError
from sqlalchemy.orm import Session

from caldera.core.spec import SpecError, spec_errors
from caldera.server.errors import CalderaError, field_error

T = TypeVar("T")
Errors = list[dict[str, Any]]


def errors_of(exc: CalderaError) -> Errors:
    return getattr(exc, "errors", None) or [field_error("", exc.message, exc.code, exc.params)]


def call(db: Session, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> tuple[T | None, Errors]:
    """``fn(*args, **kwargs)``, usually building the API's body and calling its route function."""
    try:
        return fn(*args, **kwargs), []
    except ValidationError as exc:
        errors = spec_errors(exc)
    except SpecError as exc:
        errors = exc.errors
    except CalderaError as exc:
        errors = errors_of(exc)
    db.rollback()
    return None, errors
