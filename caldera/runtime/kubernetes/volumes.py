"""The storage spaces a job mounts (LaunchRequest.mounts: host path, path in the job, writable) as pod volumes.

The storage dir is a shared file system every node sees at the same path (docs/storage.md). By default each mount
is a ``hostPath`` volume of its host path (type Directory: a missing folder fails the pod rather than the kubelet
making one as root); with ``storage_claim`` set, one PersistentVolumeClaim that mounts the storage dir's root, each
mount a ``subPath`` of it. The host path comes from the platform's resolver and the path in the job from the user:
the host path must lie strictly below the platform's own roots (a hostPath is never a place a user chose), and the
path in the job is checked against the allowlist and the pod's other mounts, as the container runtime checks it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from caldera.config import Settings
from caldera.runtime.base import LaunchError, LaunchRequest
from caldera.runtime.kubernetes.settings import KubernetesSettings
from caldera.runtime.mount_points import check_mount_points

CLAIM_VOLUME = "storage"  # the claim's one volume in claim mode; hostPath volumes are space-<i>


@dataclass(frozen=True)
class SharedRoots:
    """Where the platform's resolver finds what jobs mount, as every node sees it: the storage dir (account and
    public spaces, the catalogue; what the claim mounts) and the personal spaces' directory."""

    storage_dir: str
    workspaces: str

    @classmethod
    def of(cls, settings: Settings) -> SharedRoots:
        return cls(os.path.realpath(settings.spaces_dir), os.path.realpath(settings.workspaces))


@dataclass(frozen=True)
class PodVolumes:
    volumes: list[dict[str, Any]]
    mounts: list[dict[str, Any]]  # the job container's volumeMounts
    on_claim: bool  # the pod mounts the claim: no fsGroup (see manifests._pod_security)


def space_volumes(
    req: LaunchRequest, ks: KubernetesSettings, roots: SharedRoots | None, taken: list[str]
) -> PodVolumes:
    """The volumes and volumeMounts of ``req.mounts``; ``taken``: the paths the platform mounts in the pod already.
    A mount that cannot be made safely is refused (LaunchError), never dropped."""
    check_mount_points(req.mounts, taken)
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    for i, (host, at, writable) in enumerate(req.mounts):
        mount: dict[str, Any] = {"mountPath": at, "readOnly": not writable}
        if not writable:  # and read-only all the way down, where the node's runtime can (a mount below the host path)
            mount["recursiveReadOnly"] = "IfPossible"
        if ks.storage_claim:
            storage_dir = _check_source(host, [roots.storage_dir] if roots else [])
            mount.update(name=CLAIM_VOLUME, subPath=Path(host).relative_to(storage_dir).as_posix())
        else:
            _check_source(host, [roots.storage_dir, roots.workspaces] if roots else [])
            mount["name"] = f"space-{i}"
            volumes.append({"name": mount["name"], "hostPath": {"path": host, "type": "Directory"}})
        mounts.append(mount)
    if ks.storage_claim and req.mounts:
        read_only = not any(writable for _, _, writable in req.mounts)
        volumes.append(
            {"name": CLAIM_VOLUME, "persistentVolumeClaim": {"claimName": ks.storage_claim, "readOnly": read_only}}
        )
    return PodVolumes(volumes, mounts, on_claim=bool(ks.storage_claim and req.mounts))


def _check_source(host: str, roots: list[str]) -> str:
    """The root of ``roots`` that ``host`` lies strictly below (absolute, normalised, no link on the way), or
    MountSourceRefused: what becomes a hostPath or a subPath is only ever a folder of the platform's storage."""
    plain = os.path.isabs(host) and host == os.path.normpath(host) and os.path.realpath(host) == host
    root = next((r for r in roots if plain and host != r and Path(host).is_relative_to(r)), None)
    if root is None:
        where = " or ".join(roots) or "no storage dir known to this runtime"
        raise LaunchError("MountSourceRefused", f"{host}: the cluster mounts only folders below {where}")
    return root
