"""vscode jobs on the process runtime: code-server on a private socket, STARTING until it answers, a password only
the platform knows, its session cookie the proxy's alone, a terminal's websocket that works through the socket."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path
from urllib.parse import unquote

import httpx
import pytest

from caldera.runtime.base import LaunchError, Phase
from caldera.runtime.local import code_server
from caldera.runtime.local.runtime import LocalRuntime
from tests import needs

from .conftest import wait_for, wait_terminal
from .test_jupyter import listening_tcp


@pytest.fixture
def settings(settings):
    return settings.model_copy(update={"code_server": Path(needs.code_server())})


def _http(sock: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://localhost", timeout=30)


def test_code_server_on_a_private_socket_with_the_platform_s_login_alone(
    launch, runtime, settings, monkeypatch, tmp_path
):
    # its settings and extensions in the owner's home; a password of the job's own would lock the platform out
    h = launch(kind="vscode", env={"HOME": str(tmp_path), "PASSWORD": "mine", "HASHED_PASSWORD": "0" * 64})
    with monkeypatch.context() as m:  # as long as code-server does not answer, the job is starting, no endpoint
        m.setattr(code_server, "login", lambda *a, **k: None)
        assert runtime.observe(h).phase is Phase.STARTING
        assert runtime.endpoints(h) == []
    wait_for(lambda: runtime.observe(h).phase is Phase.RUNNING, timeout=120, interval=0.3, what="code-server")

    [ep] = runtime.endpoints(h)
    assert (ep.name, ep.base_url) == ("lab", "/") and ep.headers["Cookie"].startswith("code-server-session=")
    # the session is the hash the platform gave it (hashed-password), which each request's cookie is compared with;
    # a plain password would make it hash (64 MiB argon2) per login and verify per request
    assert "$argon2id$v=19$m=8192,t=1,p=1$" in unquote(ep.headers["Cookie"])
    scratch, run_dir = Path(h.data["scratch"]), Path(h.data["run_dir"])
    assert stat.S_ISSOCK(os.stat(ep.socket).st_mode) and stat.S_IMODE(os.stat(ep.socket).st_mode) == 0o600
    assert Path(ep.socket).parent == run_dir and Path(ep.socket).samefile(h.data["socket"])  # the pinned link
    pid = json.loads((run_dir / "rank-0.pid").read_text())["child_pid"]
    assert listening_tcp(pid) == []  # no TCP port
    password = (run_dir / "jupyter.token").read_text().strip()
    assert len(password) >= 32 and stat.S_IMODE((run_dir / "jupyter.token").stat().st_mode) == 0o600
    assert not (scratch / code_server.CONFIG).exists()  # read and gone: nothing on disk lets another job in
    for leak in (
        json.dumps(h.data),
        (run_dir / "meta.json").read_text(),
        ep.headers["Cookie"],
        Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace"),
        Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"),
    ):
        assert password not in leak
    assert code_server.login(ep.socket, "not-the-password") is None  # the password is checked
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert f"SHELL={shutil.which('bash')}".encode() in environ  # its terminals' shell: not the user's nologin
    assert not [e for e in environ if e.startswith((b"PASSWORD=", b"HASHED_PASSWORD="))]

    with _http(ep.socket) as http:
        no_login = http.get("/")
        assert no_login.status_code == 302 and no_login.headers["location"] == "./login"  # no login, no editor
        opened = http.get("/", headers=ep.headers)  # logged in: to the workspace it opens
        assert opened.status_code == 302 and opened.headers["location"] == f"./?folder={tmp_path}/work/{h.job_id}"
        page = http.get(f"/?folder={tmp_path}/work/{h.job_id}", headers=ep.headers)
        assert page.status_code == 200 and "workbench" in page.text and password not in page.text
    assert LocalRuntime(settings).endpoints(h)[0].socket == ep.socket  # a restarted server logs in again

    runtime.stop(h, grace_s=5)
    assert wait_terminal(runtime, h, timeout=30).phase in (Phase.SUCCEEDED, Phase.FAILED)
    assert runtime.endpoints(h) == []
    assert password not in b"".join(runtime.logs(h)).decode(errors="replace")


def test_a_missing_code_server_is_a_launch_error_with_its_reason(launch, runtime, settings, tmp_path):
    runtime.settings = settings.model_copy(update={"code_server": tmp_path / "no-code-server"})
    with pytest.raises(LaunchError) as caught:
        launch(kind="vscode")
    assert caught.value.reason == "CodeServerMissing" and "no-code-server" in str(caught.value)
