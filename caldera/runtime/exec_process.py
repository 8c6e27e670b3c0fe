"""A command the platform started inside a running job (``Runtime.exec``), seen from the platform's side: its
input, its output streams, its terminal size, its end.

With a terminal (``tty``) the command's stdin, stdout and stderr are one PTY whose master end the platform holds:
one output stream, and a resize is the master's window size (the kernel signals SIGWINCH to the command). Without
one they are three pipes: stdout (stream 1) and stderr (stream 2) apart, and the end of input is a closed stdin.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import signal
import struct
import subprocess
import termios

from caldera.runtime.local import procs

STDOUT, STDERR = 1, 2
_TERM = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$")
EOF_CHAR = b"\x04"  # what a terminal reads as the end of input (Ctrl-D at the start of a line)
PIPE_BYTES = 1 << 20


class ExecProcess:
    def __init__(self, proc: subprocess.Popen[bytes], master: int | None):
        self.proc = proc
        self.master = master

    @property
    def tty(self) -> bool:
        return self.master is not None

    def outputs(self) -> list[tuple[int, int]]:
        """(stream, fd) to read until each gives b"" (a PTY's EIO is its end too: see ``read``)."""
        if self.master is not None:
            return [(STDOUT, self.master)]
        assert self.proc.stdout is not None and self.proc.stderr is not None
        return [(STDOUT, self.proc.stdout.fileno()), (STDERR, self.proc.stderr.fileno())]

    @staticmethod
    def read(fd: int, size: int = PIPE_BYTES) -> bytes:
        try:
            return os.read(fd, size)
        except OSError:  # EIO: every holder of the PTY's other end is gone
            return b""

    @property
    def input_fd(self) -> int:
        return self.master if self.master is not None else self.proc.stdin.fileno()  # type: ignore[union-attr]

    def write(self, data: bytes) -> None:
        fd = self.input_fd
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]

    def close_input(self) -> None:
        if self.master is not None:
            self.write(EOF_CHAR)
        elif self.proc.stdin is not None:
            self.proc.stdin.close()

    def resize(self, rows: int, cols: int) -> None:
        if self.master is not None:
            fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def wait(self, timeout: float | None = None) -> int:
        """The exit code; a signal's death is 128 + its number, as a shell says it."""
        code = self.proc.wait(timeout)
        return code if code >= 0 else 128 - code

    def kill(self) -> None:
        """SIGKILL the command and everything it started that is still below the process the platform started
        (a runtime's helper, nsenter, podman); what escaped into the job dies with the job."""
        tree, todo = [], [self.proc.pid]
        while todo:
            pid = todo.pop()
            tree.append(pid)
            todo.extend(procs.children(pid))
        procs.kill_all(tree, signal.SIGKILL)

    def close(self) -> None:
        if self.master is not None:
            os.close(self.master)
            self.master = None
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()


def terminal_name(term: str) -> str:
    """The client's ``TERM`` where it is a terminal's name (letters, digits, ``._+-``), else ``xterm``."""
    return term if _TERM.match(term) else "xterm"


def spawn(
    argv: list[str], env: dict[str, str], tty: bool, pass_fds: tuple[int, ...] = (), cwd: str = "/"
) -> ExecProcess:
    """Start ``argv`` (the runtime's helper, whose own argv holds nothing of the user's but after ``--``) with a
    fixed environment, on a new PTY or on pipes."""
    if not tty:
        proc = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=pass_fds,
            start_new_session=True,
        )
        for pipe in (proc.stdin, proc.stdout):  # fewer, larger chunks for a bulk stream (scp through SSH)
            try:
                fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BYTES)  # type: ignore[union-attr]
            except OSError:  # over /proc/sys/fs/pipe-max-size for this uid: the default then
                pass
        return ExecProcess(proc, None)
    master, slave = os.openpty()
    try:
        # setsid execs in place as the leader of a new session whose controlling terminal is the PTY: what runs
        # there gets the terminal's signals (Ctrl-C, SIGWINCH on a resize, SIGHUP when the platform hangs up)
        proc = subprocess.Popen(
            [shutil.which("setsid") or "setsid", "--ctty", "--", *argv],
            env=env,
            cwd=cwd,
            stdin=slave,
            stdout=slave,
            stderr=slave,
            pass_fds=pass_fds,
        )
    except BaseException:
        os.close(master)
        raise
    finally:
        os.close(slave)
    return ExecProcess(proc, master)
