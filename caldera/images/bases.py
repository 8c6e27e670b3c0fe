"""What a build form may build on: an allowlist drawn from the catalogues, never a reference the user typed. The
admins' environments (base images and ready environments) whose image is on this host, and the ready images built
from a form that the user may run (their Python is known from their form). A choice is one of these, named by the
environment's reference or the image's catalogue id; anything else is refused, another user's private image as if
it did not exist."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.orm import Session

from caldera.config import Settings
from caldera.db.models import Image, User
from caldera.errors import Invalid, NotFound
from caldera.images import catalogue, environments
from caldera.images.form import PYTHONS


@dataclass(frozen=True)
class Base:
    choice: str  # what the form sends: an environment's reference or a catalogue image's id
    reference: str  # what the Containerfile's FROM names
    kind: str  # base | ready | image
    python: str
    cuda: str
    inside: str
    present: bool  # on this host (a catalogue image: in the registry, pulled when built on)
    makes_it: str | None = None  # the admin's command that makes a missing environment


def choices(db: Session, settings: Settings, user: User, has: Callable[[str], bool]) -> list[Base]:
    """Every base the form offers this user, missing environments included (shown with the command that makes
    them, not choosable)."""
    return _environments(db, has) + [_image_base(settings, i) for i in catalogue.runnable(db, user) if _builds_on(i)]


def resolve(db: Session, settings: Settings, user: User, choice: str, has: Callable[[str], bool]) -> Base:
    """The base ``choice`` names, if it is one ``user`` may build on; NotFound otherwise (Invalid for an
    environment that is not on this host)."""
    ref = environments.canonical(choice) if catalogue.PLATFORM_IMAGE.fullmatch(choice) else None
    if ref is not None:
        found = next((b for b in _environments(db, has) if b.reference == ref), None)
    else:
        img = db.get(Image, choice)
        usable = img is not None and img.state == "ready" and _builds_on(img) and catalogue.may_use(db, user, img)
        found = _image_base(settings, img) if usable else None
    if found is None:
        raise NotFound(f"no base {choice[:80]!r} among the images you may build on (GET /api/v1/images/bases)",
                       "BaseNotOffered", {"base": repr(choice[:80])})  # fmt: skip
    if not found.present:
        raise Invalid("base", f"{ref} is not on this host; an admin makes it with `{found.makes_it}`",
                      "BaseMissing", {"base": ref, "command": found.makes_it})  # fmt: skip
    return found


def _environments(db: Session, has: Callable[[str], bool]) -> list[Base]:
    out = []
    for e in environments.entries(db):
        if e.python in PYTHONS:
            view = environments.view(e, has(e.ref))
            out.append(Base(e.ref, e.ref, e.kind, e.python, e.cuda, e.inside, view["present"], view["makes_it"]))
    return out


def _builds_on(img: Image) -> bool:
    return img.source == "form" and (img.form or {}).get("python") in PYTHONS


def _image_base(settings: Settings, img: Image) -> Base:
    form = img.form or {}
    named = [*(["JupyterLab"] if form.get("jupyter") else []), *(["code-server"] if form.get("vscode") else [])]
    inside = " ".join([*named, *form.get("pip", [])])
    return Base(img.id, catalogue.reference(settings, img), "image", form["python"], form.get("cuda", "none"),
                inside[:200], True)  # fmt: skip
