"""Saving a running session (any interactive kind: Jupyter, an IDE) as an image: ``podman commit`` of the session's
container (what the user installed into the image's file system; the workspace is a mount and stays out),
size-capped, pushed and recorded as a new tag of the user's image. It runs in the build queue, so its log reads like
a build's.

``podman commit`` writes the container's configuration into the image: the session's environment (the user's
values, API keys among them, and the platform's), the lab's command line, working directory, user and labels.
The snapshot gets the configuration of the image the session ran from instead (``_restore_config``), so whoever
may run it learns nothing of the session but its files."""

from __future__ import annotations

import json
import subprocess
import time

from sqlalchemy.orm import Session

from caldera.core.kinds import is_interactive
from caldera.db.models import Image, Job, User
from caldera.errors import Conflict, Forbidden
from caldera.images import catalogue
from caldera.images.builds import Builder, BuildFailed, BuildQueue, log_path
from caldera.images.host import Host
from caldera.runtime.container.runtime import container_name


def default_tag() -> str:
    return time.strftime("snap-%Y%m%d-%H%M%S", time.gmtime())


def start(p: Host, q: BuildQueue, db: Session, user: User, job: Job, name: str, tag: str | None):
    """``job``: one the user may see (the server looks it up with its visibility rule)."""
    if job.user_id != user.id:
        raise Forbidden("only the session's owner saves it")
    if not is_interactive(job.kind) or job.state != "Running":
        why = f"only a running interactive session can be saved; job {job.id} is a {job.state} {job.kind} job"
        raise Conflict(why)
    if p.settings.runtime != "container":
        raise Conflict("sessions run in containers only with the container runtime")
    catalogue.check_quota(db, p.settings, user)
    container = container_name(job.id, job.attempt, 0)
    form = {"job_id": job.id, "from_image": job.spec.get("image")}
    img = catalogue.new(db, user, f"user/{user.username}", name, tag or default_tag(), "private", "snapshot", form)
    db.commit()
    q.submit(img.id, lambda image_id: _commit(p, q, image_id, container))
    return img


def _commit(p: Host, q: BuildQueue, image_id: str, container: str) -> None:
    log = log_path(p, image_id)
    with p.session() as db:
        ref = catalogue.reference(p.settings, db.get(Image, image_id))
    b = q.builder
    source = _config(b, _inspect(b, "container", container, "{{.Image}}").strip())
    committed = f"localhost/caldera-snapshot:{image_id}"
    work = f"caldera-snapshot-{image_id}"
    try:
        b.run([*b.podman, "commit", "--format=oci", container, committed], log, 1800)
        b.run([*b.buildah, "from", "--pull=never", "--name", work, committed], log, 300)
        b.run([*b.buildah, "config", *_restore_config(_config(b, committed), source), work], log, 300)
        b.run([*b.buildah, "commit", "--rm", "--format=oci", work, ref], log, 1800)
    finally:
        subprocess.run([*b.buildah, "rm", work], capture_output=True, timeout=120)
        b.remove(committed)
    size, cap = b.size(ref), p.settings.snapshot_max_mib * catalogue.MIB
    if size > cap:
        raise BuildFailed(f"the snapshot is {size // catalogue.MIB} MiB, over the {cap // catalogue.MIB} MiB cap")
    q.finish(image_id, ref, log)


def _inspect(b: Builder, kind: str, name: str, fmt: str) -> str:
    argv = [*b.podman, kind, "inspect", name, "--format", fmt]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise BuildFailed(f"cannot inspect the session's {kind}: {out.stderr.strip()[-300:]}")
    return out.stdout


def _config(b: Builder, image: str) -> dict:
    return json.loads(_inspect(b, "image", image, "{{json .Config}}") or "{}") or {}


def _env(config: dict) -> dict[str, str]:
    return dict(e.split("=", 1) for e in config.get("Env") or [] if "=" in e)


def _restore_config(committed: dict, source: dict) -> list[str]:
    """``buildah config`` options that turn the committed configuration back into the source image's: the
    session's variables removed (by name) and the image's own values back, its command, entry point, working
    directory and user, and no label the session added. Each value is bound to its option (``--opt=value``), so
    none can be read as an option of its own."""
    now, then = _env(committed), _env(source)
    labels = source.get("Labels") or {}
    return [
        *(f"--env={k}-" for k in now if k not in then),
        *(f"--env={k}={v}" for k, v in then.items() if now.get(k) != v),
        *(f"--label={k}-" for k in committed.get("Labels") or {} if k not in labels),
        f"--cmd={json.dumps(source['Cmd']) if source.get('Cmd') else ''}",
        f"--entrypoint={json.dumps(source['Entrypoint']) if source.get('Entrypoint') else ''}",
        f"--workingdir={source.get('WorkingDir') or ''}",
        f"--user={source.get('User') or ''}",
    ]
