"""A command started inside a running rank (``LocalRuntime.exec``): the job's uid, the rank's namespaces.

Root starts ``nsenter --target=<the rank's init> --mount --pid --net -- python -I -c <this module's main> <fd>``
with a fixed environment: nothing of the user's is in that argv. What to run (the user's command, the environment
the platform built for it, the job's working directory and uid) is JSON read from the pipe ``fd``, the one channel.
In the rank's namespaces this helper, still root, takes the terminal when there is one, drops to the job's uid
with no supplementary groups, no capabilities and no_new_privs, enters the working directory as that uid (a
symlink the job planted gives it nothing) and only then execs the command, looked up by the job's own PATH.

Standard library only: it starts per command, like the shim.
"""

from __future__ import annotations

import json
import os
import sys

_PR_SET_NO_NEW_PRIVS = 38


def _drop(uid: int, gid: int) -> None:
    import ctypes

    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")


def _take_terminal() -> None:
    """A session of the command's own, the PTY its controlling terminal (taken from the session nsenter leads
    outside the namespaces), so Ctrl-C and SIGWINCH reach it and nothing else."""
    import fcntl
    import termios

    try:
        os.setsid()
    except PermissionError:  # already a session leader (no nsenter before us)
        pass
    fcntl.ioctl(0, termios.TIOCSCTTY, 1)


def main(fd: int) -> int:
    with os.fdopen(fd) as f:
        req = json.load(f)
    try:
        if req["tty"]:
            _take_terminal()
        if req["uid"] is not None:
            _drop(req["uid"], req["gid"])
        os.umask(0o022)
        try:
            os.chdir(req["workdir"])
        except OSError:
            os.chdir("/")
        argv = req["argv"]
        os.execvpe(argv[0], argv, req["env"])
    except OSError as exc:
        print(f"caldera exec: {req['argv'][0]}: {exc.strerror}", file=sys.stderr, flush=True)
        return 127 if isinstance(exc, FileNotFoundError) else 126
    return 126  # not reached: execvpe returns only by raising


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
