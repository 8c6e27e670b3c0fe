"""Files a job owns, made by a root server without trusting anything the job could have planted.

A job runs as its owner's uid and may have left symlinks anywhere it can write. So the server creates directories
only below parents that it owns, refuses what is not a plain directory, changes ownership with lchown, and writes
into a job-owned directory through a fresh O_EXCL|O_NOFOLLOW file that is renamed into place (a rename replaces a
planted symlink instead of following it).

Layout (``data_dir`` is 0711: traversable, not listable, by job uids):

    workspaces/<username>/          0700, the owner's uid: HOME and every job's working directory
    scratch/<job_id>.<attempt>/      0700, the owner's uid: preemption notice, the lab's socket and runtime files,
                                     the owner's SSH public keys (authorized_keys, 0600)
    runs/                            0700 root: logs, supervisor state, the platform's copy of the lab token
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from caldera.runtime.base import RunAs
from caldera.runtime.local import view


def platform_dir(path: Path, mode: int) -> None:
    """A directory of the platform's own (created with its parents), with exactly ``mode``."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, mode)


def owned_dir(path: Path, run_as: RunAs | None, *, fresh: bool = False, inside: tuple[str, ...] = ()) -> Path:
    """``path`` as a 0700 directory of ``run_as``; its parent must be the platform's. With ``fresh``, whatever was
    there before is removed first (a stale attempt's scratch), and the directories ``inside`` it (relative paths,
    parents first) are made too -- while ``path`` is still root's, so nothing the job does can redirect them."""
    if fresh and os.path.lexists(path):
        if os.path.islink(path) or not os.path.isdir(path):
            os.unlink(path)
        else:
            shutil.rmtree(path)  # fd-based on Linux: never follows a symlink out of the tree
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode):
            raise RuntimeError(f"{path} is not a directory") from None
        if inside:
            raise RuntimeError(f"{path} is not fresh") from None
    for sub in inside:
        os.mkdir(path / sub, 0o700)
    if run_as is not None:
        for sub in reversed(inside):
            os.lchown(path / sub, run_as.uid, run_as.gid)
        os.lchown(path, run_as.uid, run_as.gid)
    os.chmod(path, 0o700)
    return path


def write_owned(path: Path, text: str, run_as: RunAs | None, mode: int = 0o600) -> None:
    """Atomically put ``text`` at ``path`` inside a directory the job owns, owned by the job."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        os.unlink(tmp)  # a leftover, or a symlink planted under this name: unlink never follows
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        if run_as is not None:
            os.fchown(fd, run_as.uid, run_as.gid)
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def remove_owned(top: Path, relpath: Path) -> None:
    """Remove the file ``top/relpath`` (``top`` the platform made, what is below it the job's) without following
    a symlink the job put on the way: it would make root delete a file of that name anywhere."""
    try:
        fd = view.walk_nofollow(str(top), str(relpath.parent))
    except OSError:  # gone, or not what the platform made: nothing of the platform's to remove
        return
    try:
        os.unlink(relpath.name, dir_fd=fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def authorized_keys(scratch: Path, keys: str, run_as: RunAs | None) -> dict[str, str]:
    """The owner's SSH public keys as ``scratch/authorized_keys`` (0600, the job's), and the variable that names it
    for the job (an sshd it starts points AuthorizedKeysFile there); nothing when the owner has no keys."""
    if not keys:
        return {}
    path = scratch / "authorized_keys"
    write_owned(path, keys, run_as)
    return {"CALDERA_SSH_AUTHORIZED_KEYS": str(path)}


def untraversable(path: Path) -> list[Path]:
    """The directories above ``path`` that an unprivileged uid cannot traverse, outermost first."""
    return [
        parent
        for parent in reversed(Path(path).resolve().parents)
        if parent.exists() and not os.stat(parent).st_mode & stat.S_IXOTH
    ]


def reachable_by_others(path: Path) -> Path | None:
    """The first directory above ``path`` that an unprivileged uid cannot traverse, or None when all can."""
    blocked = untraversable(path)
    return blocked[0] if blocked else None


if __name__ == "__main__":  # for the set-up scripts: `python3 -m caldera.runtime.local.owner PATH`
    import sys

    print("\n".join(str(p) for p in untraversable(Path(sys.argv[1]))))
