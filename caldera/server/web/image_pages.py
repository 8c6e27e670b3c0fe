"""Images: mine and the public ones (size, visibility, state, quota used) and the build form. Every rule is the
API's (caldera/server/api_images.py); its errors are shown on the form."""

from __future__ import annotations

import re
from dataclasses import dataclass

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import RedirectResponse
from sqlalchemy import select
from sqlalchemy.orm import Session

from caldera.db.models import Image, User
from caldera.images import bases, catalogue
from caldera.images.form import CUDA, CUDNN
from caldera.server import api_images, tenancy
from caldera.server.deps import db_session, platform
from caldera.server.platform import Platform
from caldera.server.web import api_call, listing
from caldera.server.web.render import checked, page
from caldera.server.web.session import page_user

router = APIRouter(include_in_schema=False)
MIB = 1 << 20
BUILD_LOGS = 10  # newest first; older ones stay readable through each row's log link


IMAGE_SORTS = {
    "created_at": Image.created_at, "name": Image.name, "state": Image.state, "size": Image.size_bytes,
    "visibility": Image.visibility, "owner": select(User.username).where(User.id == Image.owner_id).scalar_subquery(),
}  # fmt: skip


def _images_page(request: Request, p: Platform, user: User, db: Session, errors=(), form=None, status=200):
    q = request.app.state.builds
    want = listing.parse(request, IMAGE_SORTS, "-created_at", ("name", "state", "visibility"))
    query = catalogue.usable_query(db, user)
    if want.filters["name"]:
        query = query.where(Image.name.contains(want.filters["name"], autoescape=True))
    for key in ("state", "visibility"):
        if want.filters[key]:
            query = query.where(getattr(Image, key) == want.filters[key])
    found, want = listing.fetch(db, query, want, IMAGE_SORTS, Image.id)
    names = tenancy.usernames(db)
    choices = bases.choices(db, p.settings, user, q.builder.has)
    present = [b for b in choices if b.present]
    default = next((b for b in present if b.kind == "base" and b.python == "3.11"), present[0] if present else None)
    return page(
        request, "images.html", status=status, user=user, errors=list(errors), form=form or {}, listing=want,
        images=[catalogue.view(p.settings, i, names.get(i.owner_id)) for i in found],
        build_logs=_build_logs(p, db, user), cudas=list(CUDA), bases=choices,
        default_base=default.choice if default else "",
        cudnns=list(CUDNN), used_mib=catalogue.used_bytes(db, user) // MIB,
        quota_mib=catalogue.quota_bytes(db, p.settings, user) // MIB,
    )  # fmt: skip


def _build_logs(p: Platform, db: Session, user: User) -> list[dict]:
    """My builds whose log the page follows, newest first: those running (live) and those that failed (the kept
    log), whatever page of the list is shown."""
    mine = select(Image).where(Image.owner_id == user.id, Image.state.in_(("building", "failed")))
    found = db.scalars(mine.order_by(Image.created_at.desc()).limit(BUILD_LOGS))
    return [catalogue.view(p.settings, i, user.username) for i in found]


@router.get("/images")
def images(request: Request, user: User = Depends(page_user), p: Platform = Depends(platform),
           db: Session = Depends(db_session)):  # fmt: skip
    return _images_page(request, p, user, db)


FIELDS = (
    "name", "tag", "visibility", "python", "base", "cuda", "cudnn", "jupyter", "vscode", "ssh", "pip", "apt",
    "extra_lines",
)  # fmt: skip


@dataclass
class Typed:
    """The build form as typed (shown again with its errors) and as the API's body: packages split on white
    space, one extra line per line."""

    form: dict
    body: dict


def typed_form(
    name: str = Form("", max_length=64),
    tag: str = Form("latest", max_length=64),
    visibility: str = Form("private", max_length=16),
    python: str = Form("3.11", max_length=8),
    base: str = Form("", max_length=200),
    cuda: str = Form("none", max_length=8),
    cudnn: str = Form("none", max_length=8),
    jupyter: bool = Form(False),
    vscode: bool = Form(False),
    ssh: bool = Form(False),
    pip: str = Form("", max_length=10_000),
    apt: str = Form("", max_length=10_000),
    extra_lines: str = Form("", max_length=30_000),
) -> Typed:
    body = {"name": name, "tag": tag or "latest", "visibility": visibility, "python": python, "base": base or None,
            "cuda": cuda, "cudnn": cudnn, "jupyter": jupyter, "vscode": vscode, "ssh": ssh, "pip": pip.split(),
            "apt": apt.split(), "extra_lines": [x for x in extra_lines.splitlines() if x.strip()]}  # fmt: skip
    return Typed({**body, "pip": pip, "apt": apt, "extra_lines": extra_lines}, body)


def by_field(errors: list[dict]) -> dict[str, list[dict]]:
    """The API's errors under the form's field they name ("pip[2]" -> pip); the rest under "" (the form)."""
    out: dict[str, list[dict]] = {}
    for e in errors:
        name = re.split(r"[.\[]", e["field"] or "")[0]
        out.setdefault(name if name in FIELDS else "", []).append(e)
    return out


@router.post("/images")
def build(
    request: Request,
    typed: Typed = Depends(typed_form),
    user: User = Depends(page_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
):
    _, errors = api_call.call(db, api_images.build, body=typed.body, user=user, p=p, q=request.app.state.builds, db=db)
    if errors:
        return _images_page(request, p, user, db, errors, typed.form, status=400)
    return RedirectResponse("/images", 303)


@router.post("/images/check")
def check_build(
    request: Request,
    typed: Typed = Depends(typed_form),
    user: User = Depends(page_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
):
    """The errors a build of the form would meet, by field, recording nothing: the same code as the build's."""
    q = request.app.state.builds
    _, errors = api_call.call(db, api_images.check_build, typed.body, user, p, q, db)
    return checked(request, by_field(errors))
