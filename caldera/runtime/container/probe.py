"""Whether this host can run jobs in containers: podman present, usable as root, and the default image there.
Decides the default runtime (see caldera.runtime.registry.default_name)."""

from __future__ import annotations

import functools
import os
import shutil

from caldera.runtime.container.podman import Podman, PodmanError
from caldera.runtime.container.settings import ContainerSettings


def usable(cs: ContainerSettings | None = None) -> bool:
    cs = cs or ContainerSettings()
    return _usable(cs.podman, tuple(cs.global_args()), str(cs.conf or ""), cs.image)


@functools.lru_cache(maxsize=8)  # asked by every Settings(); the answer does not change under a running server
def _usable(binary: str, args: tuple[str, ...], conf: str, image: str) -> bool:
    if os.geteuid() != 0 or shutil.which(binary) is None:
        return False  # rootful only: jobs run as their owners' uids, which only root can give them
    pm = Podman(list(args), conf or None, timeout_s=30)
    try:
        pm.run("info", "--format", "{{.Host.OCIRuntime.Name}}")
        return pm.image_exists(image)
    except PodmanError:
        return False
