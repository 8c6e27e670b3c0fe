"""A rank's own view of the host: its own PID namespace (it sees only its own processes; another job's command line
and environment are not in its /proc), its own /tmp and /var/tmp (a directory of its scratch) and its own /dev/shm.

The supervisor (root, in the host's namespaces) calls ``new_pid_namespace`` before it forks: the fork becomes PID 1
of the new namespace, the rank's init. That init calls ``enter`` while still root, then drops privileges. Its mounts
live in a mount namespace of its own (propagation from the host only, never back), so nothing is left to undo: the
namespaces go when the rank's last process does.

The only path the job influences is its scratch's ``tmp``: it is opened one component at a time without following
a symlink, must be a directory the job's uid owns, and is mounted through that open descriptor, so a symlink the job
planted there binds nothing else of the host.

Standard library only (the shim imports it).
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat

_CLONE_NEWNS = 0x00020000
_CLONE_NEWPID = 0x20000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 0x2, 0x4, 0x8
_MS_RDONLY, _MS_REMOUNT = 0x1, 0x20
_MS_BIND, _MS_REC, _MS_SLAVE = 0x1000, 0x4000, 0x80000
_PRIVATE_TOPS = ("/tmp", "/var/tmp")


def private_top(at: str) -> str | None:
    """The job's own top (its /tmp or /var/tmp) that ``at`` lies below, or None."""
    return next((t for t in _PRIVATE_TOPS if os.path.commonpath([at, t]) == t), None)


_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = [None if v is None else v.encode() for v in (source, target, fstype, data)]
    _check(_libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]), f"mount {target}")


def new_pid_namespace() -> None:
    """The caller's next child is PID 1 of a new PID namespace (the caller itself stays where it is)."""
    _check(_libc.unshare(_CLONE_NEWPID), "unshare(CLONE_NEWPID)")


def walk_nofollow(top: str, relpath: str, make_mode: int | None = None) -> int:
    """An O_PATH descriptor of the directory ``top/relpath``, reached one component at a time without following a
    symlink below ``top`` (a symlink, or a file, on the way fails with OSError). With ``make_mode``, missing
    directories are made, root's, with that mode."""
    flags = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(top, flags)
    for part in [p for p in relpath.split("/") if p and p != "."]:
        try:
            if make_mode is not None:
                try:
                    os.mkdir(part, make_mode, dir_fd=fd)
                except FileExistsError:
                    pass
            nxt = os.open(part, flags, dir_fd=fd)
        finally:
            os.close(fd)
        fd = nxt
    return fd


def _bind(source_fd: int, target_fd: int) -> None:
    _mount(f"/proc/self/fd/{source_fd}", f"/proc/self/fd/{target_fd}", None, _MS_BIND | _MS_REC)


def enter(private_tmp: str, uid: int, keep: list[str], mounts: list[tuple[str, str, bool]] = ()) -> None:
    """In PID 1 of the rank's new PID namespace, as root: a mount namespace of its own with ``private_tmp`` (a
    directory ``uid`` owns) on /tmp and /var/tmp, a fresh /dev/shm, and a /proc of the new PID namespace. The job's
    own directories in ``keep`` (its workspace and scratch: the platform's, so their last component is not the
    job's to replace) stay where they are when they lie below /tmp or /var/tmp. Then the storage ``mounts``."""
    _check(_libc.unshare(_CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _mount(None, "/", None, _MS_REC | _MS_SLAVE)  # the host's mounts reach us, ours never reach the host
    # opened in the new namespace (a bind takes its source from its own), before /tmp is covered
    if not os.path.isabs(private_tmp):
        raise ValueError(f"{private_tmp} is not absolute")
    tmp = walk_nofollow("/", private_tmp)
    kept = {path: os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for path in keep}
    # the spaces too, before /tmp is covered (a data directory may lie below it)
    sources = [
        (os.open(host, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC), at, w) for host, at, w in mounts
    ]
    try:
        st = os.fstat(tmp)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
            raise PermissionError(f"{private_tmp} is not a directory of uid {uid}")
        for top in ("/tmp", "/var/tmp"):
            if not os.path.isdir(top) or os.path.islink(top):
                continue
            top_fd = os.open(top, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                _bind(tmp, top_fd)
            finally:
                os.close(top_fd)
            for path, fd in kept.items():
                if os.path.commonpath([path, top]) == top:
                    # made by root in the job's fresh /tmp; passable, not listable, like the data directory
                    target = walk_nofollow(top, os.path.relpath(path, top), make_mode=0o711)
                    try:
                        _bind(fd, target)
                    finally:
                        os.close(target)
        for source, at, writable in sources:
            _mount_space(source, at, writable)
    finally:
        for fd in (tmp, *kept.values(), *(source for source, _, _ in sources)):
            os.close(fd)
    if os.path.isdir("/dev/shm"):
        _mount("tmpfs", "/dev/shm", "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=1777")
    _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)


def _mount_space(source: int, at: str, writable: bool) -> None:
    """A storage space (``source``, a descriptor of the platform's path) bound at ``at``, read-only unless
    ``writable``, in this namespace only, below /tmp or /var/tmp (the job's own), where the mount point is made,
    root's. Nowhere else: root runs code in this namespace after the mounts (the supervisor, ``exec``'s helper), so
    a space, whose files its user chose, covering a directory of the host (root's Python among them) would run
    them as root. The mount point is reached, before and after the bind, without following a link, so a link
    another rank of the job planted binds or remounts nothing else."""
    top = private_top(at)
    if top is None:  # refused at launch already (LocalRuntime.launch); never reached
        raise OSError(errno.EPERM, f"cannot mount a space at {at}: only below /tmp or /var/tmp")
    rel = os.path.relpath(at, top)
    try:
        target = walk_nofollow(top, rel, make_mode=0o711)
    except OSError as exc:
        why = f"it must be a folder, not a link ({exc.strerror})"
        raise OSError(exc.errno, f"cannot mount a space at {at}: {why}") from None
    try:
        _bind(source, target)
    finally:
        os.close(target)
    mounted = walk_nofollow(top, rel)  # the root of the mount just made
    try:
        flags = _MS_BIND | _MS_REMOUNT | _MS_NOSUID | _MS_NODEV | (0 if writable else _MS_RDONLY)
        _mount(None, f"/proc/self/fd/{mounted}", None, flags)
    finally:
        os.close(mounted)
