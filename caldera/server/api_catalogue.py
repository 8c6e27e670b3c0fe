"""The datasets and models catalogue (caldera/storage/catalogue.py) and imports from URL into spaces
(caldera/storage/fetch.py) through the API (docs/storage.md)."""

from __future__ import annotations

import secrets
import time
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from caldera import outbound
from caldera.core import catalogue_names as names
from caldera.core.states import JobState
from caldera.db.models import CatalogueEntry, CatalogueName, Job, StorageImport, StorageSpace, User
from caldera.server import catalogue_copies, files, imports, repo_imports, tenancy
from caldera.server.api_files import Caller, _fs_errors, caller
from caldera.server.deps import platform
from caldera.server.errors import Conflict, Invalid, NotFound
from caldera.server.platform import Platform
from caldera.storage import hub
from caldera.storage.catalogue import Reader, may_change, owner_or_admin
from caldera.storage.errors import NameClash, NoSuchPath, PathRefused
from caldera.storage.fetch import allowed_networks, refused
from caldera.storage.paths import MAX_PATH_CHARS, file_parts
from caldera.storage.spaces import Access, Kind, SpaceRef

router = APIRouter(prefix="/api/v1", tags=["catalogue"])
KindParam = Annotated[str, Path(pattern="^(dataset|model)$")]
# anchored: a pattern alone is searched for anywhere in the value ("Bad Name!" holds "ad")
NAME_PATTERN, VERSION_PATTERN = names.anchored(names.NAME), names.anchored(names.VERSION)
NameParam = Annotated[str, Path(pattern=NAME_PATTERN)]
VersionParam = Annotated[str, Path(pattern=VERSION_PATTERN)]
_TAG = r"^[A-Za-z0-9][A-Za-z0-9 ._+-]{0,31}$"


def _view(c: Caller, entry: CatalogueEntry, who: Reader) -> dict:
    """The entry as ``who`` may see it: where it was copied from (a space and folder) and whom it is shared with
    are its owner's and admins' to know, not every reader's."""
    owner = c.db.get(User, entry.owner_id)
    view = {
        "kind": entry.kind,
        "name": entry.name,
        "version": entry.version,
        "ref": f"{entry.name}@{entry.version}",
        "description": entry.description,
        "tags": entry.tags,
        "owner": owner.username if owner else "",
        "visibility": entry.visibility,
        "framework": entry.framework,
        "produced_by": entry.produced_by,
        "size_bytes": entry.size_bytes,
        "files": entry.files,
        "created_at": entry.created_at,
        "state": entry.state,  # copying (size_bytes and files: so far), ready, failed
    }
    if may_change(entry, who):
        view |= {"source": entry.source, "shared_with": entry.shared_with, "left_out": entry.left_out or [],
                 "error": entry.error}  # fmt: skip
    return view


class PublishIn(BaseModel):
    model_config = ConfigDict(extra="forbid")  # produced_by is the platform's to set (from_job), never a claim

    kind: str = Field(..., pattern="^(dataset|model)$")
    name: str = Field(..., pattern=NAME_PATTERN)
    version: str = Field(..., pattern=VERSION_PATTERN)
    space: str = Field("", max_length=80, description="the space to copy from (with from_job: left out)")
    path: str = Field("", max_length=MAX_PATH_CHARS, description="the folder of the space; its root when empty")
    description: str = Field("", max_length=names.MAX_DESCRIPTION_CHARS)
    tags: list[Annotated[str, Field(pattern=_TAG)]] = Field(default_factory=list, max_length=32)
    visibility: str = Field("private", pattern=names.anchored(names.VISIBILITY))
    shared_with: list[Annotated[str, Field(pattern=names.anchored(names.SHARE))]] = Field(
        default_factory=list,
        max_length=names.MAX_SHARES,
        description="user:<name> or account:<name>, for visibility shared",
    )
    framework: str = Field(
        "", max_length=64, pattern=names.anchored(names.FRAMEWORK), description="models: pytorch, jax..."
    )
    from_job: str = Field("", max_length=32, pattern="^[A-Za-z0-9]*$",
                          description="models: a job of yours that succeeded; path is in its workspace")  # fmt: skip


def _space_of(body: PublishIn, c: Caller) -> str:
    """The space to copy from: ``body.space``, or with ``from_job`` the job's workspace (its owner's personal
    space), once the job has succeeded; a model so published records the job (``produced_by``), which nobody
    else can claim."""
    if not body.from_job:
        if not body.space:
            raise Invalid("space", "a space to publish from, or from_job")
        return body.space
    if body.kind != "model":
        raise Invalid("from_job", "only a model records the job that produced it")
    job = c.db.get(Job, body.from_job)
    if job is None or job.user_id != c.user.id:
        raise NotFound(f"no job {body.from_job!r} of yours")
    if job.state != JobState.SUCCEEDED.value:
        raise Conflict(f"job {job.id} is {job.state}: its output is published once it has succeeded")
    workspace = f"personal:{c.user.username}"
    if body.space not in ("", "personal", workspace):
        raise Invalid("space", f"a job's output is in its workspace, {workspace}: leave space out")
    return workspace


@router.post("/catalogue", status_code=202)
def publish(body: PublishIn, c: Caller = Depends(caller), p: Platform = Depends(platform)):
    """Publish a folder of a space you may write as a dataset or model version: the platform copies its regular
    files and folders (links, FIFOs, sockets and devices are left out: ``left_out`` says which), so the version
    never changes. With ``from_job``, a folder of a succeeded job's workspace as a model that records the job.

    Everything is checked now; the copy runs in the server's background: the version is ``copying`` (its size and
    files so far) until it is ``ready``, the only state a job mounts, or ``failed`` (``error``: why, and its name and
    version are free again). ``GET /catalogue/{kind}/{name}@{version}`` follows it."""
    if catalogue_copies.copying_count(c.db, c.user) >= catalogue_copies.MAX_PER_USER:
        raise Conflict(f"you have {catalogue_copies.MAX_PER_USER} versions being copied; publish this one when one "
                       "is ready")  # fmt: skip
    return begin_publish(body, c, p)


def begin_publish(body: PublishIn, c: Caller, p: Platform) -> dict:
    """A publish checked and its copy started, the version copying; the platform's own publish of a job's output
    (caldera/server/job_publish.py, one at a time) comes here past the limit on a user's copies at once."""
    opened = c.open(_space_of(body, c), Access.WRITE)
    entry = CatalogueEntry(**body.model_dump(exclude={"space", "path", "from_job"}), produced_by=body.from_job)
    with _fs_errors():
        files.catalogue_for(c.spaces.settings).reserve(c.db, c.user, opened, body.path, entry)
    c.db.commit()
    catalogue_copies.start(p, entry.id)
    return _view(c, entry, Reader.of(c.db, c.user))


@router.get("/catalogue")
def search(
    kind: Annotated[str | None, Query(pattern="^(dataset|model)$")] = None,
    q: Annotated[str, Query(max_length=200, description="words every entry shown holds")] = "",
    c: Caller = Depends(caller),
):
    """The datasets and models you may read, searched in their names, versions, descriptions, tags, frameworks."""
    who = Reader.of(c.db, c.user)
    entries = files.catalogue_for(c.spaces.settings).search(c.db, who, kind, q)
    return [_view(c, e, who) for e in entries]


@router.get("/catalogue/{kind}/{ref}")
def show(kind: KindParam, ref: Annotated[str, Path(max_length=97)], c: Caller = Depends(caller)):
    """One entry: ``name@version``, or ``name`` for its newest version you may read."""
    who = Reader.of(c.db, c.user)
    entry = files.catalogue_for(c.spaces.settings).find(c.db, who, kind, ref)
    return _view(c, entry, who)


@router.delete("/catalogue/{kind}/{name}/{version}")
def remove(kind: KindParam, name: NameParam, version: VersionParam, c: Caller = Depends(caller)):
    """Its owner or an admin removes a version; refused while a running job mounts it."""
    catalogue = files.catalogue_for(c.spaces.settings)
    who = Reader.of(c.db, c.user)
    entry = catalogue.find(c.db, who, kind, f"{name}@{version}")
    owner_or_admin(entry, who)
    jobs = files.catalogue_mounts(c.db, entry)
    if jobs:
        ref, ids = f"{kind} {name}@{version}", ", ".join(jobs)
        raise Conflict(f"{ref} is in use by running jobs {ids}: delete it once they end", "SpaceInUse",
                       {"space": ref, "jobs": ids})  # fmt: skip
    catalogue.remove(c.db, entry)
    return {"kind": kind, "name": name, "version": version, "deleted": True}


class WritersIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    writers: list[Annotated[str, Field(pattern=names.anchored(names.SHARE))]] = Field(
        ..., max_length=names.MAX_SHARES, description="user:<name> or account:<name>: who else publishes versions"
    )


def _writers_view(c: Caller, claim: CatalogueName) -> dict:
    return {"kind": claim.kind, "name": claim.name, "owner": tenancy.username(c.db, claim.owner_id),
            "writers": list(claim.writers or [])}  # fmt: skip


@router.get("/catalogue/{kind}/{name}/writers")
def writers(kind: KindParam, name: NameParam, c: Caller = Depends(caller)):
    """Who besides its owner publishes versions under the name: its owner's or an admin's to see and say."""
    catalogue = files.catalogue_for(c.spaces.settings)
    return _writers_view(c, catalogue.claim(c.db, Reader.of(c.db, c.user), kind, name))


@router.put("/catalogue/{kind}/{name}/writers")
def grant(kind: KindParam, name: NameParam, body: WritersIn, c: Caller = Depends(caller)):
    """Its owner (or an admin) lets users and accounts' members publish new versions under the name; each
    version stays its publisher's, read-only and unchanging; the list replaces the one before ([] takes it back)."""
    catalogue = files.catalogue_for(c.spaces.settings)
    claim = catalogue.grant(c.db, Reader.of(c.db, c.user), kind, name, body.writers)
    c.db.commit()
    return _writers_view(c, claim)


# -- imports from URL -------------------------------------------------------------------------------------------


class ImportIn(BaseModel):
    url: str = Field(
        ..., max_length=outbound.MAX_URL_CHARS, description="http(s) URL, hf://[datasets/]OWNER/REPO[@REV]"
    )
    space: str = Field(..., max_length=80)
    path: str = Field(..., max_length=MAX_PATH_CHARS, description="the new file's (a repository's: folder's) path")


def _import_view(c: Caller, imp: StorageImport, space: str) -> dict:
    view = {
        "id": imp.id,
        "url": imp.url,
        "space": space,
        "path": imp.path,
        "state": "running" if imports.running_here(imp.id) else imp.state,
        "done_bytes": imp.done_bytes,
        "total_bytes": imp.total_bytes,
        "error": imp.error,
        "created_at": imp.created_at,
        "finished_at": imp.finished_at,
    }
    return {**view, **repo_imports.view(c.db, imp)} if hub.is_repo(imp.url) else view


def _checked_source(url: str, settings) -> tuple[str, str]:
    """The import's source as stored (a repository's with its revision) and the URL its connections start at, refused
    now with the reason where it can be (checked again at each connection)."""
    if hub.is_repo(url):
        source = str(hub.parse(url))
        if not settings.huggingface_mirror_url:
            raise hub.no_mirror()
        url = settings.huggingface_mirror_url
    else:
        source = url
    try:
        outbound.check_url(url)
    except outbound.OutboundRefused as exc:
        raise PathRefused(str(exc)) from None
    return source, url


@router.post("/imports", status_code=201)
def start_import(body: ImportIn, request: Request, c: Caller = Depends(caller)):
    """Download ``url`` into a space you may write, in the server; ``GET /imports/{id}`` shows its progress. An
    ``hf://`` repository (from the configured mirror) becomes the new folder ``path``, its files imported in turn."""
    source, url = _checked_source(body.url, c.spaces.settings)
    opened = c.open(body.space, Access.WRITE)
    try:
        outbound.checked_url(url, allowed_networks(c.spaces.settings))
    except outbound.OutboundRefused as exc:
        raise PathRefused(refused(exc)) from None
    names = file_parts(body.path)
    with _fs_errors():
        try:
            opened.tree.stat(names)
            raise NameClash(f"{body.path!r} already exists")
        except NoSuchPath:
            pass
        opened.tree.stat(names[:-1])  # the folder must exist
    import_id = repo_imports.head_id() if hub.is_repo(source) else secrets.token_hex(16)
    imp = StorageImport(id=import_id, user_id=c.user.id, space_id=opened.row.id, path="/".join(names),
                        url=source, state="running", done_bytes=0, error="", created_at=time.time())  # fmt: skip
    c.db.add(imp)
    c.db.flush()
    imports.start(request.app.state.platform, c.spaces, imp.id, c.user.id, commit=c.db.commit)
    return _import_view(c, imp, str(opened.ref))


def _import_of(c: Caller, import_id: str) -> tuple[StorageImport, str]:
    imp = c.db.get(StorageImport, import_id)
    if imp is None or imp.user_id != c.user.id:
        raise NotFound("no such import")
    row = c.db.get(StorageSpace, imp.space_id)
    return imp, str(SpaceRef(Kind(row.kind), row.name)) if row else ""


ImportId = Annotated[str, Path(pattern="^[0-9a-f]{32}$")]


@router.get("/imports/{import_id}")
def import_status(import_id: ImportId, c: Caller = Depends(caller)):
    imp, space = _import_of(c, import_id)
    return _import_view(c, imp, space)


@router.post("/imports/{import_id}/restart")
def restart_import(import_id: ImportId, request: Request, c: Caller = Depends(caller)):
    """Go on with an import that failed or was interrupted (a server restart), from where its bytes end; a file of
    a repository's import restarts the repository's (its files not done, in turn)."""
    imp, space = _import_of(c, import_id)
    imp = repo_imports.head_of(c.db, imp) or imp
    c.open(space, Access.WRITE)  # still allowed to write there
    if imp.state == "done" or imports.running_here(imp.id):
        raise Conflict(f"import {imp.id} is {'done' if imp.state == 'done' else 'running'}")
    if hub.is_repo(imp.url) and not c.spaces.settings.huggingface_mirror_url:
        raise hub.no_mirror()
    imp.state, imp.error, imp.finished_at = "running", "", None
    imports.start(request.app.state.platform, c.spaces, imp.id, c.user.id, commit=c.db.commit)
    return _import_view(c, imp, space)
