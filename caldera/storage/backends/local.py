"""Spaces as directories: personal spaces are the users' workspaces (``<workspaces>/<user>``, 0700, the owner's);
account and public spaces live under ``storage_dir`` (a shared file system on a cluster) as ``<kind>/<name>/data``,
where ``<kind>/<name>`` is root's and 0700: no job reaches a space by its host path, only through the mounts the
platform gives it. Inside, folders are 0777 and the platform's files 0666, so the gate is the mount alone: a job
whose user may write the space (a member with mode rw, an admin) gets it read-write and writes as its own uid;
every other job gets it read-only, and no job gets it at all without read access."""

from __future__ import annotations

import os
from pathlib import Path

from caldera.config import Settings
from caldera.storage.backends.base import StorageBackend
from caldera.storage.spaces import Kind, SpaceRef
from caldera.storage.tree import Owner, Tree, make_root

_SHARED_MODE = 0o777  # account and public spaces: the mount is the gate (see above)


class LocalBackend(StorageBackend):
    name = "local"

    def __init__(self, settings: Settings):
        self.workspaces = settings.workspaces
        self.spaces = settings.spaces_dir

    def host_path(self, ref: SpaceRef) -> Path:
        if ref.kind is Kind.PERSONAL:
            return self.workspaces / ref.name
        if ref.kind is Kind.PUBLIC:
            return self.spaces / "public" / "data"
        return self.spaces / "account" / ref.name / "data"

    def store(self, ref: SpaceRef, owner: Owner | None) -> Tree:
        path = self.host_path(ref)
        if ref.kind is Kind.PERSONAL:
            make_root(str(path), owner, 0o700)
            return Tree(str(path), owner)
        make_root(str(path.parent), None, 0o700)
        make_root(str(path), None, _SHARED_MODE)
        if os.stat(path).st_mode & 0o7777 != _SHARED_MODE:  # a root made before jobs wrote shared spaces
            os.chmod(path, _SHARED_MODE)
        return Tree(str(path), None, dir_mode=_SHARED_MODE, file_mode=0o666)
