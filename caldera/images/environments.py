"""The admins' catalogue of the platform's own images: base images the build form builds on and ready environments
jobs run in, each with its Python, CUDA and what is inside. The forms offer the entries whose image is on this host;
an entry whose image is missing is listed with the command that makes it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from caldera.db.models import Environment
from caldera.errors import Conflict, Invalid, NotFound
from caldera.images.catalogue import PLATFORM_IMAGE


class EnvironmentForm(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ref: str = Field(..., max_length=128)
    kind: Literal["base", "ready"] = "ready"
    python: str = Field(..., min_length=1, max_length=16, pattern=r"^3\.\d{1,2}$")
    cuda: str = Field("none", max_length=16, pattern=r"^(none|\d{1,2}\.(\d{1,2}|x))$")
    inside: str = Field("", max_length=500)


def canonical(ref: str) -> str:
    """``caldera/<name>:<tag>`` for any way of naming a platform image; refused otherwise (users' images are in
    the registry's catalogue, not this one)."""
    m = PLATFORM_IMAGE.fullmatch(ref)
    if m is None:
        raise Invalid("ref", f"{ref[:80]!r} is not a platform image (caldera/<name>:<tag>)")
    return f"{m[1]}:{m[2] or 'latest'}"


def entries(db: Session, kind: str | None = None) -> list[Environment]:
    q = select(Environment).order_by(Environment.kind.desc(), Environment.python, Environment.ref)
    return list(db.scalars(q if kind is None else q.where(Environment.kind == kind)))


def add(db: Session, form: EnvironmentForm, by: str) -> Environment:
    ref = canonical(form.ref)
    if db.get(Environment, ref) is not None:
        raise Conflict(f"{ref} is already in the catalogue")
    env = Environment(ref=ref, kind=form.kind, python=form.python, cuda=form.cuda, inside=form.inside, added_by=by,
                      added_at=time.time())  # fmt: skip
    db.add(env)
    return env


def remove(db: Session, ref: str) -> None:
    env = db.get(Environment, canonical(ref))
    if env is None:
        raise NotFound(f"no environment {ref[:80]!r} in the catalogue")
    db.delete(env)


def view(env: Environment, present: bool) -> dict[str, Any]:
    suite = env.ref.rpartition(":")[2]
    return {
        "ref": env.ref,
        "kind": env.kind,
        "python": env.python,
        "cuda": env.cuda,
        "inside": env.inside,
        "present": present,
        "makes_it": None if present else _command(env, suite),
    }


def _command(env: Environment, suite: str) -> str:
    name = env.ref.partition("/")[2].partition(":")[0]
    if env.kind == "base":
        return f"caldera images bootstrap --suite {suite} --ready none"
    return f"caldera images bootstrap --suite {suite} --ready {name}"


def views(db: Session, has: Callable[[str], bool], kind: str | None = None) -> list[dict[str, Any]]:
    return [view(e, has(e.ref)) for e in entries(db, kind)]
