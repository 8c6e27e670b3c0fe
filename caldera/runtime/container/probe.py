"""Whether this host can run jobs in containers: podman present, usable as root, and the default image there.
Decides the default runtime (see caldera.runtime.default.default_choice), and says why not."""

from __future__ import annotations

import functools
import os
import shutil

from caldera.runtime.container.podman import Podman, PodmanError
from caldera.runtime.container.settings import ContainerSettings


def usable(cs: ContainerSettings | None = None) -> bool:
    return problem(cs) is None


def problem(cs: ContainerSettings | None = None) -> str | None:
    """Why jobs cannot run in containers here, or None when they can."""
    cs = cs or ContainerSettings()
    return _problem(cs.podman, tuple(cs.global_args()), str(cs.conf or ""), cs.image)


def describe(cs: ContainerSettings | None = None) -> str:
    """What makes the container runtime usable, for ``caldera up``'s line about its choice."""
    cs = cs or ContainerSettings()
    return f"{_version(tuple(cs.global_args()))} usable, image {cs.image}"


@functools.lru_cache(maxsize=8)  # asked by every Settings(); the answer does not change under a running server
def _problem(binary: str, args: tuple[str, ...], conf: str, image: str) -> str | None:
    if shutil.which(binary) is None:
        return f"{binary} not installed"
    if os.geteuid() != 0:
        return "not root (jobs run as their owners' uids, which only rootful podman can give them)"
    pm = Podman(list(args), conf or None, timeout_s=30)
    try:
        pm.run("info", "--format", "{{.Host.OCIRuntime.Name}}")
    except PodmanError as exc:
        return f"podman does not work here: {str(exc).strip()[:200]}"
    try:
        present = pm.image_exists(image)
    except PodmanError as exc:
        return f"podman cannot look up images: {str(exc).strip()[:200]}"
    return None if present else f"image {image} missing (caldera images bootstrap makes it)"


@functools.lru_cache(maxsize=4)
def _version(args: tuple[str, ...]) -> str:
    try:
        out = Podman(list(args), None, timeout_s=30).run("--version")  # "podman version 4.3.1"
    except PodmanError:
        return "podman"
    return out.strip().replace(" version ", " ") or "podman"
