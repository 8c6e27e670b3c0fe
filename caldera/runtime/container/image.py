"""What an image holds, read from its root file system (``podman image mount``, read-only, about 60 ms) rather
than by starting a container: so a command missing from the image fails the launch with a reason instead of
becoming a job that dies at once."""

from __future__ import annotations

import json
import os
from pathlib import Path, PurePosixPath

from caldera.runtime.container.podman import Podman, PodmanError

# what podman gives a container whose image sets no PATH (an imported debootstrap tree sets none)
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_MAX_LINKS = 40


def _resolve(rootfs: Path, path: str) -> Path | None:
    """``path`` inside the image, following symlinks as the container would (absolute targets from its root)."""
    parts = list(PurePosixPath(path).parts[1:])
    here = PurePosixPath("/")
    hops = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            here = here.parent
            continue
        nxt = here / part
        host = rootfs / str(nxt).lstrip("/")
        if host.is_symlink():
            hops += 1
            if hops > _MAX_LINKS:
                return None
            target = PurePosixPath(os.readlink(host))
            parts = list(target.parts[1:] if target.is_absolute() else target.parts) + parts
            here = PurePosixPath("/") if target.is_absolute() else here
            continue
        here = nxt
    return rootfs / str(here).lstrip("/")


class ImageInfo:
    """One image (by id: a name may be moved to another image) and what was found in it."""

    def __init__(self, podman: Podman, image: str, image_id: str, config: dict):
        self.podman, self.image, self.id = podman, image, image_id
        env = dict(e.split("=", 1) for e in config.get("Env") or [] if "=" in e)
        self.path = env.get("PATH", DEFAULT_PATH)
        self._checked: dict[tuple[str, bool], tuple[str, str] | None] = {}

    @classmethod
    def load(cls, podman: Podman, image: str) -> ImageInfo | None:
        """The image of this name, or None when there is none on this host."""
        try:
            out = podman.run("image", "inspect", image, "--format", "{{.Id}} {{json .Config}}")
        except PodmanError as exc:
            if "unknown" in exc.stderr or "no such" in exc.stderr.lower() or "not known" in exc.stderr:
                return None
            raise
        image_id, _, config = out.strip().partition(" ")
        return cls(podman, image, image_id, json.loads(config or "{}") or {})

    def missing(self, exe: str, jupyter: bool = False) -> tuple[str, str] | None:
        """Why the image cannot run ``exe`` (an absolute path or a name on its PATH) as (reason, message), or None
        when it can. Says nothing (None) when the image cannot be looked into: the job then reports it itself."""
        key = (exe, jupyter)
        if key not in self._checked:
            self._checked[key] = self._look(exe, jupyter)
        return self._checked[key]

    def _look(self, exe: str, jupyter: bool) -> tuple[str, str] | None:
        try:
            rootfs = Path(self.podman.run("image", "mount", self.image).strip())
        except PodmanError:
            return None
        try:
            candidates = [exe] if "/" in exe else [f"{d}/{exe}" for d in self.path.split(":") if d.startswith("/")]
            found = [p for p in (_resolve(rootfs, c) for c in candidates) if p and p.is_file()]
            if not found:
                return "CommandNotFound", f"command not found in image {self.image}: {exe}"
            if jupyter and not _has_jupyterlab(rootfs):
                return "JupyterNotInImage", f"image {self.image} has no JupyterLab (python3 -m jupyterlab)"
            return None
        finally:
            try:
                self.podman.run("image", "unmount", self.image)
            except PodmanError:
                pass


def _has_jupyterlab(rootfs: Path) -> bool:
    patterns = ("usr/lib/python3*/*-packages/jupyterlab", "usr/local/lib/python3*/*-packages/jupyterlab")
    return any(any(rootfs.glob(p)) for p in patterns) or any(rootfs.glob("opt/*/lib/python3*/site-packages/jupyterlab"))
