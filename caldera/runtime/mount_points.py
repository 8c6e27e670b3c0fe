"""Where a runtime lets a job's storage spaces be mounted (LaunchRequest.mounts' paths in the job), checked again at
launch: the runtime is the boundary, whatever the spec's validation said."""

from __future__ import annotations

import os
from collections.abc import Iterable

from caldera.core.spec import MOUNT_TOPS, mount_top, nests
from caldera.runtime.base import LaunchError


def check_mount_points(mounts: Iterable[tuple[str, str, bool]], taken: Iterable[str | os.PathLike[str]]) -> None:
    """Each path in the job lies in the allowlist (core.spec.MOUNT_TOPS) and neither covers nor lies in another
    mount: one of ``taken`` (the platform's own in the job's view) or another space's. MountPointRefused else."""
    seen = [os.path.normpath(p) for p in taken]
    for _, at, _ in mounts:
        if at != os.path.normpath(at) or mount_top(at) is None:
            raise LaunchError("MountPointRefused", f"{at}: a space is mounted only below {', '.join(MOUNT_TOPS)}")
        clash = next((t for t in seen if nests(at, t)), None)
        if clash is not None:
            raise LaunchError("MountPointRefused", f"{at}: covers or lies in {clash}, mounted there already")
        seen.append(at)
