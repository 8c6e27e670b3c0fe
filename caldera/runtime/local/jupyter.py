"""Jupyter Lab as a job: the command line, and the probe that tells STARTING from RUNNING.

Security model: Lab binds 127.0.0.1 only and requires a random token; only the platform's proxy knows it (from
``LocalRuntime.endpoints``). The token reaches Jupyter through JUPYTER_TOKEN_FILE (a 0600 file in the run dir),
not the command line, where every local user could read it in /proc/<pid>/cmdline. A token that does not come
from Jupyter itself is printed as "..." in Jupyter's startup banner, so it never lands in the job log either.

No cross-origin check is relaxed (no allow_origin, allow_remote_access stays off). The proxy must
* send ``Authorization: token <tok>`` (the Endpoint's headers) on every HTTP request and websocket upgrade --
  token-authenticated requests skip Jupyter's Origin and XSRF checks;
* set Host to ``127.0.0.1:<port>`` (Jupyter refuses non-loopback Host names: DNS-rebinding protection) and drop the
  browser's Origin header;
* keep the path as is (Lab serves under ``base_url``, e.g. /jobs/<id>/lab/) and tunnel websockets
  (``<base_url>api/kernels/<id>/channels``, ``<base_url>terminals/websocket/<n>``, ``<base_url>api/events/subscribe``),
  forwarding the Sec-WebSocket-Protocol the browser asks for (v1.kernel.websocket.jupyter.org).
"""
from __future__ import annotations

import http.client
import os
import sys
from pathlib import Path


def normalise_base_url(base_url: str) -> str:
    base = "/" + base_url.strip("/")
    return base if base == "/" else base + "/"


def lab_argv(port: int, base_url: str, root_dir: Path) -> list[str]:
    argv = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
            "--port-retries=0",                                  # the endpoint is this port or nothing
            f"--ServerApp.base_url={base_url}", f"--ServerApp.root_dir={root_dir}",
            # no calls to the internet from a lab host
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            "--LabApp.news_url=None"]
    if os.geteuid() == 0:
        argv.append("--allow-root")
    return argv


def ready(port: int, base_url: str, token: str, timeout_s: float = 1.0) -> bool:
    """Lab answers its authenticated status API."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request("GET", f"{base_url}api/status", headers={"Authorization": f"token {token}"})
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()
