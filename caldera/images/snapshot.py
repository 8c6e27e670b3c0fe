"""Saving a running Jupyter session as an image: ``podman commit`` of the session's container (what the user
installed into the image's file system; the workspace is a mount and stays out), size-capped, pushed and recorded
as a new tag of the user's image. It runs in the build queue, so its log reads like a build's."""

from __future__ import annotations

import time

from sqlalchemy.orm import Session

from caldera.db.models import Image, User
from caldera.images import catalogue
from caldera.images.builds import BuildFailed, BuildQueue, log_path
from caldera.runtime.container.runtime import container_name
from caldera.server import jobs
from caldera.server.errors import Conflict, Forbidden
from caldera.server.platform import Platform


def default_tag() -> str:
    return time.strftime("snap-%Y%m%d-%H%M%S", time.gmtime())


def start(p: Platform, q: BuildQueue, db: Session, user: User, job_id: str, name: str, tag: str | None):
    job = jobs.visible(db, user, job_id)
    if job.user_id != user.id:
        raise Forbidden("only the session's owner saves it")
    if job.kind != "jupyter" or job.state != "Running":
        raise Conflict(f"only a running Jupyter session can be saved; job {job.id} is a {job.state} {job.kind} job")
    if p.settings.runtime != "container":
        raise Conflict("sessions run in containers only with the container runtime")
    catalogue.check_quota(db, p.settings, user)
    container = container_name(job.id, job.attempt, 0)
    form = {"job_id": job.id, "from_image": job.spec.get("image")}
    img = catalogue.new(db, user, f"user/{user.username}", name, tag or default_tag(), "private", "snapshot", form)
    db.commit()
    q.submit(img.id, lambda image_id: _commit(p, q, image_id, container))
    return img


def _commit(p: Platform, q: BuildQueue, image_id: str, container: str) -> None:
    log = log_path(p, image_id)
    with p.session() as db:
        ref = catalogue.reference(p.settings, db.get(Image, image_id))
    q.builder.run([*q.builder.podman, "commit", "--format=oci", container, ref], log, 1800)
    size, cap = q.builder.size(ref), p.settings.snapshot_max_mib * catalogue.MIB
    if size > cap:
        raise BuildFailed(f"the snapshot is {size // catalogue.MIB} MiB, over the {cap // catalogue.MIB} MiB cap")
    q.finish(image_id, ref, log)
