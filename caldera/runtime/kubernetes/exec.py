"""``Runtime.exec`` on Kubernetes: the pods' exec API (a websocket to the API server, which the node's kubelet
serves), seen by the platform as the ``ExecProcess`` the other runtimes give.

The stream's channels are stdin (0), stdout (1), stderr (2), the end status (3) and the terminal's size (4). One
thread per command owns the websocket and moves bytes between it and local pipes, so the platform reads and writes
file descriptors as it does for a local process. The command runs as the pod's own user (the job's uid: the pod's
securityContext); the API has no option to choose another, and none is asked for.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import ssl
import subprocess
import threading
from collections import deque
from typing import Any

from caldera.runtime.base import ExecError
from caldera.runtime.exec_process import (
    EOF_CHAR,
    PIPE_BYTES,
    STDERR,
    STDOUT,
    ExecProcess,
    terminal_name,
)

CONTAINER = "job"  # the job's container in every pod (manifests.py)
STDIN, ERROR, RESIZE = 0, 3, 4
# the user's argv stays a list of words: it follows the fixed script as its arguments, never inside a shell string
_WITH_TERM = 'TERM=$1; export TERM; shift; exec "$@"'
_EXIT_STATUS = re.compile(r": exit status (\d{1,3})$")
_CHUNK = 1 << 16
_KILLED = 128 + 9  # what a shell says of a command killed by SIGKILL, as ExecProcess.wait does
_NO_STATUS = 255  # the stream ended without the command's status (as ssh says a lost connection)


def start(core: Any, namespace: str, pod: str, argv: list[str], tty: bool, term: str, timeout_s: float) -> PodExec:
    """``argv`` in the pod's job container, on a terminal or not; raises ExecError("StartFailed") when the API
    server refuses (the pod went, the platform's account may not exec, the node does not answer)."""
    from kubernetes.client.exceptions import ApiException
    from kubernetes.stream import stream

    command = ["/bin/sh", "-c", _WITH_TERM, "caldera-exec", terminal_name(term) if tty else "dumb", *argv]
    try:
        ws = stream(
            core.connect_get_namespaced_pod_exec,
            pod,
            namespace,
            container=CONTAINER,
            command=command,
            stdin=True,
            stdout=True,
            stderr=not tty,  # a terminal is one stream
            tty=tty,
            binary=True,
            _preload_content=False,
            _request_timeout=timeout_s,
        )
    except ApiException as exc:
        refusal = str(exc.reason or exc.status)[:300]  # the handshake's status line and the API server's Status
        raise ExecError("StartFailed", f"the cluster refused the command: {refusal}") from exc
    return PodExec(ws, tty)


class PodExec(ExecProcess):
    """A command in a pod, behind local pipes: ``outputs`` and ``input_fd`` as for a local process."""

    def __init__(self, ws: Any, tty: bool):  # no local process, so no ExecProcess.__init__
        self.proc, self.master = None, None  # type: ignore[assignment]
        self._ws, self._tty = ws, tty
        self._out = {STDOUT: _pipe()} if tty else {STDOUT: _pipe(), STDERR: _pipe()}
        self._in_r, self._in_w = _pipe()
        self._wake_r, self._wake_w = os.pipe()
        self._resizes: deque[tuple[int, int]] = deque()
        self._killed = False
        self._code: int | None = None
        self._done = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._pump, name="pod-exec", daemon=True)
        self._thread.start()

    @property
    def tty(self) -> bool:
        return self._tty

    def outputs(self) -> list[tuple[int, int]]:
        return [(stream, r) for stream, (r, _) in self._out.items()]

    @property
    def input_fd(self) -> int:
        return self._in_w

    def close_input(self) -> None:
        if self._tty:
            self.write(EOF_CHAR)
        elif self._in_w >= 0:
            os.close(self._in_w)  # the pump then closes the stream's stdin (the v5 protocol's close signal)
            self._in_w = -1

    def resize(self, rows: int, cols: int) -> None:
        if self._tty:
            self._resizes.append((rows, cols))
            self._wake()

    def wait(self, timeout: float | None = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired("pod exec", timeout or 0)
        assert self._code is not None
        return self._code

    def kill(self) -> None:
        """Close the stream: the kubelet ends the command's session (a terminal's command gets SIGHUP, one on
        pipes sees its stdin end); what escaped it dies with the pod."""
        self._killed = True
        self._wake()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.kill()
        for r, _ in self._out.values():  # a pump blocked on a full pipe nobody reads gets EPIPE and ends
            _close(r)
        self._thread.join(10)
        if self._thread.is_alive():  # stuck on the network: leave it its descriptors
            return
        for fd in (self._in_r, self._in_w, self._wake_r, self._wake_w):
            _close(fd)
        self._in_w = -1

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b".")
        except OSError:  # closed, or full: the pump wakes anyway
            pass

    # -- the pump thread ----------------------------------------------------------------------------------------
    def _pump(self) -> None:
        from websocket import WebSocketException

        status = b""
        try:
            status = self._move()
            status += self._ws.read_channel(ERROR)  # a status that came with the stream's last frames
        except (OSError, WebSocketException, ValueError):
            pass
        code, message = exit_status(status)
        try:
            if message and not self._killed:
                _write_all(self._out[STDOUT if self._tty else STDERR][1], (message + "\n").encode(errors="replace"))
        except OSError:  # nobody reads any more
            pass
        for _, w in self._out.values():
            _close(w)
        self._code = _KILLED if self._killed else code
        self._ws.close()
        self._done.set()

    def _move(self) -> bytes:
        """Bytes between the stream and the pipes until the stream ends or the command is killed; the status."""
        ws, status = self._ws, b""
        sock = ws.sock.sock
        poller = select.poll()
        for fd in (sock.fileno(), self._in_r, self._wake_r):
            poller.register(fd, select.POLLIN)
        while ws.is_open() and not self._killed:
            pending = isinstance(sock, ssl.SSLSocket) and sock.pending()
            ready = {sock.fileno()} if pending else {fd for fd, _ in poller.poll()}
            if sock.fileno() in ready:
                ws.update(0)
                for stream, (_, w) in self._out.items():
                    _write_all(w, ws.read_channel(stream))
                status += ws.read_channel(ERROR)
            if self._wake_r in ready:
                os.read(self._wake_r, _CHUNK)
            while self._resizes:  # before the input that follows them (a terminal's size, then what is typed)
                rows, cols = self._resizes.popleft()
                ws.write_channel(RESIZE, json.dumps({"Width": cols, "Height": rows}).encode())
            if self._in_r in ready:
                data = os.read(self._in_r, _CHUNK)
                if data:
                    ws.write_channel(STDIN, data)
                else:
                    poller.unregister(self._in_r)
                    ws.close_channel(STDIN)
        return status


def exit_status(status: bytes) -> tuple[int, str]:
    """The command's exit code from the stream's status (a Kubernetes Status object), and the message to show
    when there is no code (the command could not start: no such file, the node refused)."""
    try:
        s = json.loads(status)
    except ValueError:
        return _NO_STATUS, "" if not status else status.decode(errors="replace")
    if s.get("status") == "Success":
        return 0, ""
    for cause in (s.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode" and str(cause.get("message")).isdigit():
            return int(cause["message"]), ""
    message = str(s.get("message") or "the command could not be started")
    said = _EXIT_STATUS.search(message)  # a kubelet that puts the code only in its words (kwok: Go's exec error)
    if said:
        return int(said[1]), ""
    return 126, message  # 126: found but not run, as sh says


def _pipe() -> tuple[int, int]:
    r, w = os.pipe()
    try:  # fewer, larger chunks for a bulk stream (scp through SSH)
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
    except OSError:
        pass
    return r, w


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _close(fd: int) -> None:
    try:
        if fd >= 0:
            os.close(fd)
    except OSError:
        pass
