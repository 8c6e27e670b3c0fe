"""Spaces as directories: personal spaces are the users' workspaces (``<workspaces>/<user>``, 0700, the owner's);
account and public spaces live under ``storage_dir`` (a shared file system on a cluster) as ``<kind>/<name>/data``,
where ``<kind>/<name>`` is root's and 0700: no job reaches a space by its host path, only through the mounts the
platform gives it. Inside, folders are 0777 and the platform's files 0666, so the gate is the mount alone: a job
whose user may write the space (a member with mode rw, an admin) gets it read-write and writes as its own uid;
every other job gets it read-only, and no job gets it at all without read access.

Unfinished uploads and imports are part files in a folder of the platform's beside each space, never inside it
(``<kind>/<name>/uploads``; ``<workspaces>/.caldera-uploads/<user>`` for a personal space, on the workspaces' file
system so that a complete part is renamed into place): a job that may write a space (in a shared one, any rw
member's) cannot rename, replace or link over where other users' uploads go."""

from __future__ import annotations

import os
import re
import shutil
import stat
from pathlib import Path

from caldera.config import Settings
from caldera.storage.backends.base import StorageBackend
from caldera.storage.spaces import Kind, SpaceRef
from caldera.storage.tree import Owner, Tree, make_root

_SHARED_MODE = 0o777  # account and public spaces: the mount is the gate (see above)
UPLOADS_DIR = ".caldera-uploads"  # under the workspaces: not a user name, which starts with a letter or digit
_PART_ID = re.compile(r"[0-9a-f]{32}")


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

    def uploads_path(self, ref: SpaceRef) -> Path:
        if ref.kind is Kind.PERSONAL:
            return self.workspaces / UPLOADS_DIR / ref.name
        return self.host_path(ref).parent / "uploads"

    def store(self, ref: SpaceRef, owner: Owner | None) -> Tree:
        path, uploads = self.host_path(ref), str(self.uploads_path(ref))
        if ref.kind is Kind.PERSONAL:
            make_root(str(path), owner, 0o700)
            make_root(str(self.workspaces / UPLOADS_DIR), None, 0o700)  # no job lists whose uploads are there
            _drop_uploads_inside(path)
            return Tree(str(path), uploads, owner)
        make_root(str(path.parent), None, 0o700)
        make_root(str(path), None, _SHARED_MODE)
        if os.stat(path).st_mode & 0o7777 != _SHARED_MODE:  # a root made before jobs wrote shared spaces
            os.chmod(path, _SHARED_MODE)
        _drop_uploads_inside(path)
        return Tree(str(path), uploads, None, dir_mode=_SHARED_MODE, file_mode=0o666)


def _drop_uploads_inside(root: Path) -> None:
    """Remove the upload folder that earlier versions kept inside a space: its parts would be readable through the
    API now that the name is no longer the platform's. Only one that is surely theirs (root's, 0700, holding
    nothing but part files named by upload ids) is removed: a user's own folder of that name is theirs."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.stat(UPLOADS_DIR, dir_fd=fd, follow_symlinks=False)
        if not (stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o700):
            return
        inner = os.open(UPLOADS_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        try:
            with os.scandir(inner) as it:
                if not all(_PART_ID.fullmatch(e.name) and e.is_file(follow_symlinks=False) for e in it):
                    return
        finally:
            os.close(inner)
        shutil.rmtree(UPLOADS_DIR, dir_fd=fd)  # descriptor-based: a link swapped in is not followed
    except (FileNotFoundError, NotADirectoryError):
        pass
    finally:
        os.close(fd)
