"""Images: list what I may use, build from a form, describe, follow a build's log, delete; image quotas."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict

from fastapi import APIRouter, Body, Depends, Header, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy.orm import Session

from caldera.core.spec import field_path
from caldera.core.tenancy import Role
from caldera.db.models import Image, ImageQuota, User
from caldera.images import bases, catalogue, environments, registry, snapshot
from caldera.images.builds import BuildQueue, log_path
from caldera.images.catalogue import RegistryDown
from caldera.images.form import CUDA, CUDNN, CUDNN_CUDA, NAME, PYTHONS, TAG, BuildForm
from caldera.runtime.local.log_follow import follow_file
from caldera.server import audit, jobs, tenancy
from caldera.server.deps import admin_user, current_user, db_session, platform
from caldera.server.errors import CalderaError, Forbidden, Invalid, InvalidFields, NotFound
from caldera.server.log_stream import Progress, live_events, parse_resume, sse_response
from caldera.server.platform import Platform

router = APIRouter(prefix="/api/v1/images", tags=["images"])


class SnapshotForm(BaseModel):
    model_config = ConfigDict(extra="forbid")
    job_id: str = Field(..., min_length=1, max_length=32, pattern=r"^[a-z0-9]+$")
    name: str = Field("session", max_length=64, pattern=NAME)
    tag: str | None = Field(None, max_length=64, pattern=TAG, description="snap-<UTC time> when empty")


class Quota(BaseModel):
    quota_mib: int = Field(..., ge=0, le=1 << 30, strict=True)


def builds(request: Request) -> BuildQueue:
    return request.app.state.builds


def parse_form(body: dict) -> BuildForm:
    try:
        form = BuildForm.model_validate(body)
    except ValidationError as exc:
        raise InvalidFields(
            [{"field": field_path(tuple(e["loc"])) or "form", "reason": e["msg"]} for e in exc.errors()]
        ) from None
    mismatch = form.mismatch()
    if mismatch is not None:
        field, code, params, english = mismatch
        raise Invalid(field, english, code, params)
    return form


@router.get("/options")
def build_options(q: BuildQueue = Depends(builds), db: Session = Depends(db_session)) -> dict:
    """What the build form offers: the Python versions of the catalogue's base images that exist here, CUDA and
    cuDNN (each cuDNN with the CUDA major version it needs)."""
    return {
        "python": offered_pythons(db, q),
        "cuda": list(CUDA),
        "cudnn": list(CUDNN),
        "cudnn_needs_cuda": {v: CUDNN_CUDA[v.split(".")[0]] for v in CUDNN if v != "none"},
    }


def offered_pythons(db: Session, q: BuildQueue) -> list[str]:
    bases = {e.ref for e in environments.entries(db, "base")}
    return [v for v in q.builder.pythons() if q.builder.base_for(v) in bases]


@router.get("/environments")
def list_environments(
    _: User = Depends(current_user), q: BuildQueue = Depends(builds), db: Session = Depends(db_session)
) -> list[dict]:
    """The catalogue of the platform's images: bases of the build form and ready environments for jobs, each with
    whether it is on this host and, if not, the command that makes it."""
    return environments.views(db, q.builder.has)


@router.get("/bases")
def list_bases(
    user: User = Depends(current_user),
    p: Platform = Depends(platform),
    q: BuildQueue = Depends(builds),
    db: Session = Depends(db_session),
) -> list[dict]:
    """What a build may name as its ``base``: the catalogue's environments and my runnable images built from a
    form (caldera/images/bases.py); ``choice`` is the value to send."""
    return [asdict(b) for b in bases.choices(db, p.settings, user, q.builder.has)]


@router.post("/environments", status_code=201)
def add_environment(
    body: environments.EnvironmentForm,
    admin: User = Depends(admin_user),
    q: BuildQueue = Depends(builds),
    db: Session = Depends(db_session),
) -> dict:
    env = environments.add(db, body, admin.username)
    audit.record(db, admin, "add-environment", env.ref, body.model_dump(exclude={"ref"}))
    db.commit()
    return environments.view(env, q.builder.has(env.ref))


@router.delete("/environments/{ref:path}", status_code=204)
def remove_environment(ref: str, admin: User = Depends(admin_user), db: Session = Depends(db_session)) -> None:
    environments.remove(db, ref)
    audit.record(db, admin, "remove-environment", ref)
    db.commit()


@router.get("")
def list_images(user: User = Depends(current_user), p: Platform = Depends(platform), db: Session = Depends(db_session)):
    names = tenancy.usernames(db)
    return [catalogue.view(p.settings, i, names.get(i.owner_id)) for i in catalogue.usable(db, user)]


@router.post("", status_code=202)
def build(
    body: dict = Body(...),
    user: User = Depends(current_user),
    p: Platform = Depends(platform),
    q: BuildQueue = Depends(builds),
    db: Session = Depends(db_session),
) -> dict:
    """Queues a build of the form; its state and log tell how it went (GET /images/{id}, /images/{id}/log)."""
    form = parse_form(body)
    catalogue.check_namespace(db, user, form.visibility, form.account)
    catalogue.check_quota(db, p.settings, user)
    _registry_reachable(p)
    form = on_base(form, user, p, q, db)
    ns = catalogue.namespace(user, form.visibility, form.account)
    img = catalogue.new(db, user, ns, form.name, form.tag, form.visibility, "form", form.model_dump(mode="json"))
    db.commit()
    q.submit(img.id)
    return catalogue.view(p.settings, img, user.username)


def check_build(body: dict, user: User, p: Platform, q: BuildQueue, db: Session) -> BuildForm:
    """The form as it will be built (its base resolved, the base's Python), or the errors a build of it meets;
    the portal's form checks as one types through it (quota and registry are the build's to find)."""
    form = parse_form(body)
    catalogue.check_namespace(db, user, form.visibility, form.account)
    return on_base(form, user, p, q, db)


def on_base(form: BuildForm, user: User, p: Platform, q: BuildQueue, db: Session) -> BuildForm:
    """The form with its base resolved through the allowlist (bases.py) and the base's Python; without a base,
    its Python's base image, which must be here."""
    if form.base is not None:
        base = bases.resolve(db, p.settings, user, form.base, q.builder.has)
        return parse_form({**form.model_dump(mode="json"), "base": base.reference, "python": base.python})
    if form.python not in offered_pythons(db, q):
        base_ref = q.builder.base_for(form.python)
        suite = PYTHONS[form.python]
        raise Invalid(
            "python",
            f"Python {form.python} needs the {base_ref} base image, not on this host; an admin makes it with "
            f"`caldera images bootstrap --suite {suite}`",
            "BaseImageMissing",
            {"python": form.python, "base": base_ref, "suite": suite},
        )
    return form


def _registry_reachable(p: Platform) -> None:
    """Before anything is recorded: a build or snapshot that cannot be pushed is refused, not queued."""
    if not registry.ping(p.settings):
        raise RegistryDown(f"the image registry at {registry.url(p.settings)} is not reachable; ask an admin")


@router.post("/snapshots", status_code=202)
def save_session(
    body: SnapshotForm,
    user: User = Depends(current_user),
    p: Platform = Depends(platform),
    q: BuildQueue = Depends(builds),
    db: Session = Depends(db_session),
) -> dict:
    """Saves a running interactive session of mine (Jupyter, VS Code) as a new tag of my image ``name`` (queued like
    a build)."""
    _registry_reachable(p)
    img = snapshot.start(p, q, db, user, jobs.visible(db, user, body.job_id), body.name, body.tag)
    return catalogue.view(p.settings, img, user.username)


@router.get("/quotas/{username}")
def get_quota(
    username: str,
    user: User = Depends(current_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
) -> dict:
    if user.username != username and user.role != Role.ADMIN.value:
        raise Forbidden("only admins see other users' quotas")
    who = tenancy.get_user(db, username)
    used, quota = catalogue.used_bytes(db, who), catalogue.quota_bytes(db, p.settings, who)
    return {"username": username, "used_mib": used / catalogue.MIB, "quota_mib": quota // catalogue.MIB}


@router.put("/quotas/{username}")
def set_quota(
    username: str,
    body: Quota,
    admin: User = Depends(admin_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
) -> dict:
    who = tenancy.get_user(db, username)
    row = db.get(ImageQuota, who.id) or ImageQuota(user_id=who.id, quota_bytes=0)
    row.quota_bytes = body.quota_mib * catalogue.MIB
    db.add(row)
    audit.record(db, admin, "set-image-quota", username, {"quota_mib": body.quota_mib})
    db.commit()
    return {"username": username, "quota_mib": body.quota_mib}


@router.get("/{image_id}")
def describe(
    image_id: str,
    user: User = Depends(current_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
) -> dict:
    img = catalogue.visible(db, user, image_id)
    return catalogue.view(p.settings, img, tenancy.username(db, img.owner_id))


def _own_build(db: Session, user: User, image_id: str) -> Image:
    """The image whose build log ``user`` may read: the owner's and, for admins, everyone's. For anyone else it does
    not exist (a public image's log may name the owner's paths and packages)."""
    img = catalogue.visible(db, user, image_id)
    if img.owner_id != user.id and user.role != Role.ADMIN.value:
        raise NotFound(f"no image {image_id[:40]!r}")
    return img


@router.get("/{image_id}/log")
def build_log(
    image_id: str,
    follow: bool = False,
    offset: int = Query(0, ge=0, le=1 << 40),  # a position every file system can seek to
    user: User = Depends(current_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
) -> StreamingResponse:
    """Plain bytes of a build's log from ``offset``; with follow, open until the build ends, read as a job's log is.
    Only the image's owner and admins read it."""
    image_id = _own_build(db, user, image_id).id

    def ended() -> bool:
        with p.session() as s:
            row = s.get(Image, image_id)
            return row is None or row.state != "building"

    return StreamingResponse(
        follow_file(log_path(p, image_id), offset, follow, ended), media_type="text/plain; charset=utf-8"
    )


@router.get("/{image_id}/stream")
def build_stream(
    image_id: str,
    last_event_id: str | None = Header(None, max_length=64),
    user: User = Depends(current_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
) -> StreamingResponse:
    """Server-sent events of a build: its state as it changes and its log as it grows, until it has ended (see
    ``caldera.server.log_stream``); readable by whoever reads its log."""
    image_id = _own_build(db, user, image_id).id
    path = log_path(p, image_id)

    def read() -> Progress | None:
        with p.session() as s:
            row = s.get(Image, image_id)
            if row is None:
                return None
            return Progress({"state": row.state, "message": row.message}, row.state != "building")

    def read_log(now: Progress, offset: int) -> Iterator[bytes]:
        return follow_file(path, offset, follow=False, ended=lambda: True)

    return sse_response(live_events(read, read_log, parse_resume(last_event_id)))


@router.delete("/{image_id}", status_code=204)
def delete(
    image_id: str,
    user: User = Depends(current_user),
    p: Platform = Depends(platform),
    q: BuildQueue = Depends(builds),
    db: Session = Depends(db_session),
) -> None:
    img = catalogue.visible(db, user, image_id)
    if img.owner_id != user.id and user.role != Role.ADMIN.value:
        raise Forbidden("only the image's owner or an admin deletes it")
    if img.state == "building":
        raise CalderaError("the image is still building")
    if img.state == "ready":
        try:
            registry.delete(p.settings, f"{img.namespace}/{img.name}", img.tag)
        except registry.RegistryError as exc:
            raise RegistryDown(str(exc)) from None
        q.discard(catalogue.reference(p.settings, img))
    db.delete(img)
    db.commit()
    log_path(p, img.id).unlink(missing_ok=True)
