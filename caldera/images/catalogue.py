"""The catalogue: which images exist, in which namespace, who may use them, how much of a quota they take."""

from __future__ import annotations

import secrets
import time
from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from caldera.config import Settings
from caldera.core.tenancy import Role
from caldera.db.models import Image, ImageQuota, User
from caldera.images import registry
from caldera.server import tenancy
from caldera.server.errors import Conflict, Forbidden, Invalid, NotFound

MIB = 1 << 20


def namespace(user: User, visibility: str, account: str | None) -> str:
    if visibility == "public":
        return "public"
    if visibility == "account":
        if not account:
            raise Invalid("account", "an account image names its account")
        return f"account/{account}"
    return f"user/{user.username}"


def reference(settings: Settings, img: Image) -> str:
    return f"{registry.host(settings)}/{img.namespace}/{img.name}:{img.tag}"


def check_namespace(db: Session, user: User, visibility: str, account: str | None) -> None:
    if visibility == "account":
        if not account:
            raise Invalid("account", "an account image names its account")
        if user.role != Role.ADMIN.value and not tenancy.is_member(db, user, account):
            raise Forbidden(f"you are not a member of account {account!r}")


def quota_bytes(db: Session, settings: Settings, user: User) -> int:
    row = db.get(ImageQuota, user.id)
    return row.quota_bytes if row else settings.image_quota_mib * MIB


def used_bytes(db: Session, user: User) -> int:
    q = select(func.coalesce(func.sum(Image.size_bytes), 0)).where(Image.owner_id == user.id, Image.state == "ready")
    return int(db.scalar(q) or 0)


def check_quota(db: Session, settings: Settings, user: User, more: int = 0) -> None:
    quota, used = quota_bytes(db, settings, user), used_bytes(db, user)
    if used + more > quota or (more == 0 and used >= quota):
        raise Forbidden(
            f"image quota exceeded: {used // MIB} MiB used{f' + {more // MIB} MiB' if more else ''} "
            f"of {quota // MIB} MiB; delete images or ask an admin for more"
        )


def new(db: Session, user: User, ns: str, name: str, tag: str, visibility: str, source: str, form: dict) -> Image:
    """A catalogue row in state building. A failed build of the same reference is replaced; a live one conflicts."""
    for old in db.scalars(select(Image).where(Image.namespace == ns, Image.name == name, Image.tag == tag)):
        if old.state == "failed":
            db.delete(old)
        else:
            raise Conflict(f"image {ns}/{name}:{tag} exists ({old.state}); choose another tag or delete it")
    img = Image(
        id=secrets.token_hex(5),
        owner_id=user.id,
        namespace=ns,
        name=name,
        tag=tag,
        visibility=visibility,
        source=source,
        form=form,
        state="building",
        message="",
        size_bytes=0,
        created_at=time.time(),
    )
    db.add(img)
    db.flush()
    return img


def usable(db: Session, user: User) -> list[Image]:
    """Ready images this user may run, and the user's own in any state (so a failed build's log can be read)."""
    if user.role == Role.ADMIN.value:
        return list(db.scalars(select(Image).order_by(Image.created_at.desc())))
    ns = ["public", f"user/{user.username}", *(f"account/{a}" for a in tenancy.user_accounts(db, user))]
    q = select(Image).where(or_(Image.owner_id == user.id, Image.namespace.in_(ns) & (Image.state == "ready")))
    return list(db.scalars(q.order_by(Image.created_at.desc())))


def may_use(db: Session, user: User, img: Image) -> bool:
    if user.role == Role.ADMIN.value or img.owner_id == user.id or img.namespace == "public":
        return True
    if img.namespace.startswith("account/"):
        return tenancy.is_member(db, user, img.namespace.removeprefix("account/"))
    return img.namespace == f"user/{user.username}"


def visible(db: Session, user: User, image_id: str) -> Image:
    img = db.get(Image, image_id)
    if img is None or not may_use(db, user, img):
        raise NotFound(f"no image {image_id[:40]!r}")
    return img


def by_reference(db: Session, settings: Settings, ref: str) -> Image | None:
    """The ready catalogue image a job's ``image:`` names, or None when it names none of the registry's."""
    prefix = registry.host(settings) + "/"
    if not ref.startswith(prefix):
        return None
    path, _, tag = ref.removeprefix(prefix).rpartition(":")
    ns, _, name = path.rpartition("/")
    q = select(Image).where(Image.namespace == ns, Image.name == name, Image.tag == tag, Image.state == "ready")
    return db.scalars(q).first()


def view(settings: Settings, img: Image, owner: str | None) -> dict[str, Any]:
    return {
        "id": img.id,
        "reference": reference(settings, img),
        "owner": owner,
        "namespace": img.namespace,
        "name": img.name,
        "tag": img.tag,
        "visibility": img.visibility,
        "source": img.source,
        "form": img.form,
        "state": img.state,
        "message": img.message,
        "size_bytes": img.size_bytes,
        "created_at": img.created_at,
        "finished_at": img.finished_at,
    }


def check_job_image(db: Session, settings: Settings, user: User, ref: str) -> None:
    """A job may name a registry image only if it is ready and this user may use it; other names (the host's own
    images, e.g. the default) are the runtime's to find."""
    if not ref.startswith(registry.host(settings) + "/"):
        return
    img = by_reference(db, settings, ref)
    if img is None:
        raise Invalid("image", f"no ready image {ref!r} in the catalogue")
    if not may_use(db, user, img):
        raise Forbidden(f"image {ref!r} is not yours to use ({img.visibility})")
