"""VS Code in the browser (code-server) as a job: its command line, and the probe that logs the platform in.

The same model as Jupyter Lab (see ``local.jupyter``):
* code-server listens on a Unix socket (0600, no TCP port) in the job's scratch directory; the platform reaches it
  through the hard link ``jupyter.pin_socket`` makes in the root-only run directory.
* It still requires a random password. The password's argon2 hash (``hashed-password``) reaches it in a 0600 config
  file the job owns, never through the environment or the command line; once the platform logged in, that file is
  deleted, so nothing on disk lets even another job of the same user in. The platform keeps its own copy of the
  password in the root-only run directory.
* The probe exchanges the password once for code-server's session cookie, which the proxy adds server-side; the
  browser never sees it, and a ``code-server-session`` cookie the browser sends is dropped.

code-server is served at the root of the lab's own origin (``/``), never under a path prefix: its workbench, web
workers and webviews resolve their URLs against the origin, and a prefix is what breaks them behind proxies.
Its own Origin check (a websocket's Origin must name the Host) is left with nothing to compare: the proxy sends no
Origin upstream and checks it itself (caldera/server/lab_proxy.py). Its port proxy (``/proxy/<port>``) is off: a
job's loopback is not the browser's business.
"""

from __future__ import annotations

import http.client
import json
import secrets
from http.cookies import SimpleCookie
from pathlib import Path
from urllib.parse import urlencode

from argon2 import PasswordHasher

from caldera.runtime.base import Endpoint, LaunchRequest
from caldera.runtime.local import owner
from caldera.runtime.local.jupyter import HOST, UnixConnection
from caldera.runtime.local.rundir import RunDir, write_text_atomic

SESSION_COOKIE = "code-server-session"
CONFIG = "code-server.yaml"  # in the job's scratch, deleted once the platform logged in
# the whole login's deadline (connect, request, answer): a login verifies the password against its argon2 hash
LOGIN_TIMEOUT_S = 3.0


# what code-server takes over its config file's password (as JUPYTER_TOKEN over Lab's token file): a job's env
# naming one would lock the platform's login out, and the job would stay Starting, probed every cycle
OVERRIDING_ENV = ("PASSWORD", "HASHED_PASSWORD")


# an argon2 hash of the password, made once at launch: given a plain ``password``, code-server checks every request's
# session cookie with argon2 (64 MiB, 3 passes); given ``hashed-password``, its login verifies the hash once and each
# request's cookie is compared with it. Light parameters: the password is 192 random bits, which no guessing reaches,
# and the login's verification must fit its deadline on a loaded host. (A hash without ``$argon`` is code-server's
# legacy SHA-256 method, kept "for legacy reasons".)
_HASHER = PasswordHasher(time_cost=1, memory_cost=8192, parallelism=1)


def config_text(password: str) -> str:
    """code-server's config file: the password's hash only (as JSON, a YAML string)."""
    return f"auth: password\nhashed-password: {json.dumps(_HASHER.hash(password))}\n"


def prepare(
    exe: str, req: LaunchRequest, rd: RunDir, scratch: Path, workdir: Path, env: dict[str, str], shell: str
) -> tuple[list[str], Path]:
    """code-server's command line and socket, for every runtime: a random password, the platform's copy in the
    root-only run directory and its hash in a config file the job owns (deleted once the platform logged in), and an
    environment that names no password of its own (``OVERRIDING_ENV``) and a terminal ``shell`` unless the job
    names one (the users the platform made have nologin)."""
    password = secrets.token_hex(24)
    write_text_atomic(rd.token, password, mode=0o600)
    config = scratch / CONFIG
    owner.write_owned(config, config_text(password), req.run_as)
    for name in OVERRIDING_ENV:
        env.pop(name, None)
    if "SHELL" not in req.spec.env:
        env["SHELL"] = shell
    sock = scratch / "lab.sock"
    return argv(exe, sock, workdir, config), sock


def argv(exe: str, sock: Path, workspace: Path, config: Path) -> list[str]:
    return [
        exe,
        f"--socket={sock}",
        "--socket-mode=600",
        f"--config={config}",
        # no calls to the internet from a job, nothing served but the editor
        "--disable-telemetry",
        "--disable-update-check",
        "--disable-proxy",
        "--disable-workspace-trust",
        "--disable-getting-started-override",
        "--ignore-last-opened",
        str(workspace),
    ]


def login(sock: str, password: str, timeout_s: float = LOGIN_TIMEOUT_S) -> str | None:
    """code-server accepts the password: returns the ``Cookie`` header value of its session, or None while it is
    not up yet (or does not answer within ``timeout_s``, all of the exchange together)."""
    conn = UnixConnection(sock, timeout_s)
    try:
        body = urlencode({"password": password})
        headers = {"Host": HOST, "Content-Type": "application/x-www-form-urlencoded"}
        conn.request("POST", "/login", body=body, headers=headers)
        # its status and headers only (http.client takes at most 100 of 64 KiB), never the body: the job controls
        # what answers on this socket, and may make it endless
        resp = conn.getresponse()
        jar: SimpleCookie = SimpleCookie()
        for header in resp.headers.get_all("Set-Cookie") or []:
            jar.load(header)
        session = jar.get(SESSION_COOKIE)
        return f"{SESSION_COOKIE}={session.coded_value}" if session is not None and session.value else None
    except (OSError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def endpoint(sock: str, cookie: str, password: str) -> Endpoint:
    """code-server as the platform's proxy reaches it: its socket, at the root, logged in with its cookie."""
    return Endpoint("lab", HOST, 0, "/", headers={"Cookie": cookie}, socket=sock, secrets=(password,))
