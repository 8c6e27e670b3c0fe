"""Jupyter Lab as a job: the command line, and the probe that tells STARTING from RUNNING and logs the platform in.

Security model:
* Lab listens on a Unix socket (no TCP port at all) in the job's scratch directory, 0700 and owned by the job's
  uid, so no other user's job can even open it. The platform (root) reaches it through a hard link in the root-only
  run directory, made from the socket itself, so a symlink (or another socket) the job later puts in its place
  redirects nothing. Under the process runtime its kernels' ZMQ sockets are Unix sockets in the job's own /tmp too
  (``ipc`` transport); a container has a loopback of its own for them.
* Lab still requires its random token. The token reaches Lab through JUPYTER_TOKEN_FILE, a 0600 file the job owns,
  never through the environment or the command line; once Lab answered, that file and Lab's cookie secret are
  deleted, so nothing on disk lets even another job of the same user in. The platform keeps its own copy in the
  root-only run directory.
* The proxy does not send the token on each request: the probe exchanges it once for Lab's login cookie, which the
  proxy adds server-side (the browser never sees it). Cookie-authenticated requests keep Jupyter's XSRF check for
  every state-changing request, which a token header would switch off.

The proxy must send the Endpoint's Cookie, set Host to ``localhost`` (Jupyter refuses other names: DNS-rebinding
protection), pass Jupyter's own ``_xsrf`` cookie and header through, and check Origin itself (see
caldera/server/lab_proxy.py).
"""

from __future__ import annotations

import http.client
import os
import socket
import stat
import sys
import time
from http.cookies import SimpleCookie
from pathlib import Path

from caldera.runtime.base import Endpoint

HOST = "localhost"


def normalise_base_url(base_url: str) -> str:
    base = "/" + base_url.strip("/")
    return base if base == "/" else base + "/"


def lab_argv(sock: Path, base_url: str, root_dir: Path, as_root: bool, ipc_kernels: bool = False) -> list[str]:
    """Lab's command line. With ``ipc_kernels`` its kernels talk ZMQ over Unix sockets next to their connection
    files in Jupyter's runtime directory (the job's alone) instead of TCP ports on loopback, where any process of
    the host could subscribe to them."""
    argv = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        f"--ServerApp.sock={sock}",
        "--ServerApp.sock_mode=0600",
        f"--ServerApp.base_url={base_url}",
        f"--ServerApp.root_dir={root_dir}",
        # no calls to the internet from a lab host
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.news_url=None",
    ]
    if ipc_kernels:
        argv.append("--KernelManager.transport=ipc")
    if as_root:
        argv.append("--allow-root")
    return argv


class UnixConnection(http.client.HTTPConnection):
    """HTTP over a Unix socket whose every read and write ends by one deadline, ``timeout`` seconds after it was
    made: a server that trickles bytes (each within a per-read timeout) cannot hold its caller longer."""

    def __init__(self, path: str, timeout: float):
        super().__init__(HOST, timeout=timeout)
        self._path = path
        self._deadline = time.monotonic() + timeout

    def connect(self) -> None:
        sock = connect_unix(self._path, max(0.001, self._deadline - time.monotonic()))
        bounded = _DeadlineSocket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=sock.detach())
        bounded.deadline = self._deadline
        self.sock = bounded


class _DeadlineSocket(socket.socket):
    deadline = 0.0

    def _arm(self) -> None:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the probe's deadline passed")
        self.settimeout(left)

    def recv_into(self, buffer, nbytes=0, flags=0):  # type: ignore[no-untyped-def]  # what http.client reads through
        self._arm()
        return super().recv_into(buffer, nbytes, flags)

    def sendall(self, data, flags=0):  # type: ignore[no-untyped-def]
        self._arm()
        return super().sendall(data, flags)


def pinned_socket(sock: str, pinned: Path) -> str | None:
    """The session server's socket as the platform reaches it, on every runtime: the link at ``pinned`` once made
    (see ``pin_socket``), never the job's own path, which the job may replace with a symlink at any time."""
    if os.path.lexists(pinned):
        return str(pinned)
    return pin_socket(sock, pinned)


def pin_socket(sock: str, pinned: Path) -> str | None:
    """The path the platform reaches Lab through: a hard link at ``pinned`` (in a directory only root may write) to
    the socket Lab made at ``sock`` in the job's scratch, taken without following a symlink, so that nothing the job
    later puts at ``sock`` redirects the platform. ``sock`` itself where no link can be made (another file system);
    None while there is no socket at ``sock``."""
    try:
        fd = os.open(sock, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            return None
        tmp = pinned.with_name(f".{pinned.name}.{os.getpid()}.tmp")
        tmp.unlink(missing_ok=True)
        run_dir = os.open(pinned.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            # linkat(AT_SYMLINK_FOLLOW) of the descriptor: the very inode opened above (a dir_fd makes it linkat)
            os.link(f"/proc/self/fd/{fd}", tmp.name, dst_dir_fd=run_dir, follow_symlinks=True)
        except OSError:  # another file system: connect_unix still refuses a symlink there, the proxy may not
            return sock
        finally:
            os.close(run_dir)
        os.replace(tmp, pinned)
        return str(pinned)
    finally:
        os.close(fd)


def connect_unix(path: str, timeout: float) -> socket.socket:
    """A connection to the Unix socket at ``path`` itself: the job owns the directory and may have put a symlink (to
    another socket of the host) there, which a root client must not follow. The socket's inode is opened without
    following anything and connected to through that descriptor."""
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            raise ConnectionRefusedError(f"{path} is not a socket")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout)
            sock.connect(f"/proc/self/fd/{fd}")
        except OSError:
            sock.close()
            raise
        return sock
    finally:
        os.close(fd)


def login(sock: str, base_url: str, token: str, timeout_s: float = 1.0) -> str | None:
    """Lab answers its authenticated status API: returns the ``Cookie`` header value of the login it granted,
    or None while it is not up yet."""
    conn = UnixConnection(sock, timeout_s)
    try:
        conn.request("GET", f"{base_url}api/status", headers={"Authorization": f"token {token}", "Host": HOST})
        resp = conn.getresponse()  # its headers only: the body is not read (see UnixConnection)
        if resp.status != 200:
            return None
        jar: SimpleCookie = SimpleCookie()
        for header in resp.headers.get_all("Set-Cookie") or []:
            jar.load(header)
        logins = [f"{name}={m.coded_value}" for name, m in jar.items() if name.startswith("username-")]
        return "; ".join(logins) or None
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def lab_endpoint(base_url: str, sock: str, cookie: str, token: str) -> Endpoint:
    """Lab as the platform's proxy reaches it: its socket, logged in with Lab's cookie, the token to cut out."""
    return Endpoint("lab", HOST, 0, base_url, headers={"Cookie": cookie}, socket=sock, secrets=(token,))
