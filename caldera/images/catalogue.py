"""The catalogue: which images exist, in which namespace, who may use them, how much of a quota they take."""

from __future__ import annotations

import re
import secrets
import time
from typing import Any

from sqlalchemy import Select, func, or_, select
from sqlalchemy.orm import Session

from caldera.config import Settings
from caldera.core.tenancy import Role
from caldera.db.membership import is_member, user_accounts
from caldera.db.models import Image, ImageQuota, User
from caldera.errors import CalderaError, Conflict, Forbidden, Invalid, NotFound
from caldera.images import registry

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
        if user.role != Role.ADMIN.value and not is_member(db, user, account):
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
    return list(db.scalars(usable_query(db, user).order_by(Image.created_at.desc())))


def usable_query(db: Session, user: User) -> Select:
    """``usable``'s images, unordered, for a list to sort and page."""
    if user.role == Role.ADMIN.value:
        return select(Image)
    ns = ["public", f"user/{user.username}", *(f"account/{a}" for a in user_accounts(db, user))]
    return select(Image).where(or_(Image.owner_id == user.id, Image.namespace.in_(ns) & (Image.state == "ready")))


def may_use(db: Session, user: User, img: Image) -> bool:
    if user.role == Role.ADMIN.value or img.owner_id == user.id or img.namespace == "public":
        return True
    if img.namespace.startswith("account/"):
        return is_member(db, user, img.namespace.removeprefix("account/"))
    return img.namespace == f"user/{user.username}"


def visible(db: Session, user: User, image_id: str) -> Image:
    img = db.get(Image, image_id)
    if img is None or not may_use(db, user, img):
        raise NotFound(f"no image {image_id[:40]!r}")
    return img


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


class RegistryDown(CalderaError):
    status = 503


# the platform's own images on the host, made by an admin (`caldera images bootstrap`: the bases and the default);
# users' images live in the registry, so no user makes one of these names
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]*"
PLATFORM_IMAGE = re.compile(rf"(?:localhost/)?(caldera/[a-z0-9]+(?:[._-][a-z0-9]+)*)(?::({_TAG}))?")
_ID = re.compile(r"(?:sha256:)?([0-9a-f]{12,64})")  # podman's image id (or a prefix of it) or a manifest digest
_CATALOGUE_ID = re.compile(r"[0-9a-f]{10}")  # Image.id
_DIGEST = r"sha256:[0-9a-f]{64}"
_REFERENCE = re.compile(rf"(?P<path>[a-z0-9][a-z0-9._/-]*?)(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?")


def resolve_job_image(db: Session, settings: Settings, user: User, name: str) -> str:
    """The reference a job runs in, for what its ``image:`` says: one of the platform's own images on the host, or a
    ready catalogue image this user may run named by its reference (with or without the registry's host), by its
    name and tag alone (the user's own namespace first), by its catalogue id, by its podman image id or by its
    manifest digest. Anything else is refused: the runtime only ever gets the reference returned here, never the
    user's string, so podman never resolves a user's id, digest or short name to an image on the host that is
    not theirs to run."""
    platform_image = PLATFORM_IMAGE.fullmatch(name)
    if platform_image:
        return f"localhost/{platform_image[1]}:{platform_image[2] or 'latest'}"
    img = db.get(Image, name) if _CATALOGUE_ID.fullmatch(name) else None
    if img is not None and img.state == "ready" and may_use(db, user, img):
        return reference(settings, img)  # its catalogue id, as `caldera images list` shows it
    by_id = _ID.fullmatch(name)
    if by_id:
        return reference(settings, _by_digest(settings, runnable(db, user), by_id[1], name))
    ref = _REFERENCE.fullmatch(name.removeprefix(registry.host(settings) + "/"))
    found = _named(db, user, ref, name) if ref else []
    if ref and ref["digest"] and found:
        found = [_by_digest(settings, found, ref["digest"].removeprefix("sha256:"), name)]
    if len(found) > 1:
        names = ", ".join(sorted(f"{i.namespace}/{i.name}:{i.tag}" for i in found))
        raise Invalid("image", f"{name!r} names several images you may run ({names}); name one of them")
    if not found:
        raise NotFound(f"no image {name!r} in the catalogue; `caldera images list` shows the images you may run")
    return reference(settings, found[0])


def _named(db: Session, user: User, ref: re.Match, name: str) -> list[Image]:
    """The ready images this user may run that ``ref`` names: with a namespace, that one (another user's private
    image is a 403, as its reference says whose it is); a name alone, among the images the user may run, their
    own namespace first. No tag means ``latest``, or any tag when a digest says which."""
    ns, _, short = ref["path"].rpartition("/")
    tag = ref["tag"] or (None if ref["digest"] else "latest")
    if not ns:
        found = [i for i in runnable(db, user) if i.name == short and tag in (None, i.tag)]
        return [i for i in found if i.namespace == f"user/{user.username}"] or found
    q = select(Image).where(Image.namespace == ns, Image.name == short, Image.state == "ready")
    named = list(db.scalars(q if tag is None else q.where(Image.tag == tag)))
    mine = [i for i in named if may_use(db, user, i)]
    if named and not mine:
        raise Forbidden(f"image {name!r} is not yours to use ({named[0].visibility})")
    return mine


def runnable(db: Session, user: User) -> list[Image]:
    return [i for i in usable(db, user) if i.state == "ready"]


def _by_digest(settings: Settings, candidates: list[Image], digest: str, name: str) -> Image:
    """The one of ``candidates`` whose manifest or config (image id) digest is or starts with ``digest``, as the
    registry has them."""
    for img in candidates:
        try:
            known = registry.digests(settings, f"{img.namespace}/{img.name}", img.tag)
        except registry.RegistryError as exc:
            raise RegistryDown(f"{exc}; name the image by its reference instead") from None
        if any(d.removeprefix("sha256:").startswith(digest) for d in known):
            return img
    raise NotFound(f"no image {name!r} among the images you may run; `caldera images list` shows them")
