"""The session servers of interactive jobs (Jupyter Lab for ``jupyter``, code-server for ``vscode``), as every
runtime that runs them on a Unix socket in the job's scratch reaches them: one table of what differs between them,
and the one way the platform logs in to them and hands them to the proxy.

For each, the platform (root) reaches the socket only through the link pinned in the root-only run directory
(``jupyter.pinned_socket``), logs in once with the secret it keeps there, on a probe thread of its own
(``logins``), and then deletes what the server read of that secret from the job's scratch, so that nothing on disk
lets anyone else in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from caldera.core.spec import JobKind
from caldera.runtime.base import Endpoint
from caldera.runtime.local import code_server, jupyter, owner
from caldera.runtime.local.logins import Logins
from caldera.runtime.local.rundir import RunDir

Meta = dict[str, Any]


@dataclass(frozen=True)
class SessionServer:
    name: str  # as a job's status names it while it does not answer yet
    # (socket, meta, secret) -> the login's Cookie header value, None while it does not answer
    login: Callable[[str, Meta, str], str | None]
    # (socket, meta, cookie, secret) -> how the proxy reaches it
    endpoint: Callable[[str, Meta, str, str], Endpoint]
    # the files in the job's scratch that carried the secret to it, deleted once the platform logged in
    read: Callable[[Meta], tuple[Path, ...]]


# the module's functions are looked up at each call (a test may replace one)
_SERVERS = {
    JobKind.JUPYTER.value: SessionServer(
        "Jupyter",
        login=lambda sock, meta, token: jupyter.login(sock, meta["base_url"], token, timeout_s=0.5),
        endpoint=lambda sock, meta, cookie, token: jupyter.lab_endpoint(meta["base_url"], sock, cookie, token),
        read=lambda meta: (Path("lab-token"), Path(meta.get("lab_runtime", "runtime"), "jupyter_cookie_secret")),
    ),
    JobKind.VSCODE.value: SessionServer(
        "code-server",
        login=lambda sock, meta, password: code_server.login(sock, password, timeout_s=code_server.LOGIN_TIMEOUT_S),
        endpoint=lambda sock, meta, cookie, password: code_server.endpoint(sock, cookie, password),
        read=lambda meta: (Path(code_server.CONFIG),),
    ),
}


def of(meta: Meta) -> SessionServer:
    return _SERVERS[meta["kind"]]


class SessionLogins(Logins):
    """The platform's logins to the session servers of one runtime's jobs."""

    def login(
        self, key: tuple[str, int], meta: Meta, rd: RunDir, secret: str | None, wait_s: float = 0.0
    ) -> str | None:
        """The login cookie of the job's server; probed (off the caller's thread) while there is none. ``secret``:
        the platform's copy of its password (token)."""
        cookie = self.known(key)
        if cookie is not None:
            return cookie
        sock = jupyter.pinned_socket(meta["socket"], rd.lab_socket)
        if not secret or sock is None:
            return None
        server = of(meta)

        def probe() -> str | None:
            cookie = server.login(sock, meta, secret)
            if cookie is not None:
                for path in server.read(meta):  # the server has read them: nothing on disk lets anyone else in now
                    owner.remove_owned(Path(meta["scratch"]), path)  # the job's folders: never through its symlinks
            return cookie

        return self.cookie(key, probe, wait_s)

    def endpoint(self, key: tuple[str, int], meta: Meta, rd: RunDir, secret: str | None) -> list[Endpoint]:
        """The server as the proxy reaches it, once logged in: the link the login pinned, never the job's own path (a
        symlink the job puts there would send the platform's proxy, as root, to any socket of the host)."""
        cookie, sock = self.known(key), jupyter.pinned_socket(meta["socket"], rd.lab_socket)
        if not cookie or not secret or not sock:
            return []
        return [of(meta).endpoint(sock, meta, cookie, secret)]
