"""``caldera exec`` and its websocket (``/api/v1/jobs/<id>/exec``) against a real `caldera up` as root, from both
sides: the owner's command runs inside the job as the job's uid with its output and exit code; another user, an
admin, a missing token, a foreign Origin (a lab's, another site's), a cookie without the page's CSRF token are
refused; the session ends when the job does."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import pytest
from websockets.exceptions import ConnectionClosedError, InvalidStatus
from websockets.sync.client import connect

from tests import needs
from tests.conftest import ServerProcess, free_port, kill_job_processes, server_env, traversable
from tests.needs import root_user  # noqa: F401 - fixture
from tests.test_isolation import _os_uid
from tests.test_server_process import token, until

pytestmark = [pytest.mark.usefixtures("root_user"), pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)]


@pytest.fixture
def runtime_name(request) -> str:
    name = getattr(request, "param", "local")
    if name == "container":
        needs.podman()
    return name


@pytest.fixture
def server(tmp_path, db_url, runtime_name):
    env = {**server_env(tmp_path, db_url), "CALDERA_RUNTIME": runtime_name, "CALDERA_METRICS_PORT": str(free_port())}
    srv = ServerProcess(traversable(tmp_path) / "data", free_port(), env).start()
    yield srv
    srv.stop()
    kill_job_processes(srv.data_dir)


def _user(server, name: str) -> dict[str, str]:
    r = httpx.post(
        server.url + "/api/v1/users", json={"username": name, "password": "password-123"}, headers=token(server)
    )
    assert r.status_code == 201, r.text
    return token(server, name, "password-123")


def _sleeper(server, h) -> str:
    spec = {"name": "sleeper", "command": ["sleep", "600"], "resources": {"cpu": 0.5, "memory_mib": 256}}
    r = httpx.post(server.url + "/api/v1/jobs", json=spec, headers=h)
    assert r.status_code == 201, r.text
    jid = r.json()["id"]
    until(server, h, jid, {"Running"}, timeout=90)
    return jid


def _caldera(server, *args: str, stdin: str = "", config=None) -> subprocess.CompletedProcess:
    env = {**server.env, **({"CALDERA_CONFIG_DIR": str(config)} if config else {})}
    return subprocess.run(
        [sys.executable, "-m", "caldera.cli.main", *args], env=env, input=stdin, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip


def _login(server, tmp_path, name: str):
    config = tmp_path / f"cli-{name}"
    r = _caldera(server, "login", "--url", server.url, "-u", name, "-p", "password-123", config=config)
    assert r.returncode == 0, r.stderr
    return config


def _ws(server, jid: str, headers: dict[str, str], **kw):
    return connect(f"ws://127.0.0.1:{server.port}/api/v1/jobs/{jid}/exec", additional_headers=headers, **kw)


def _refused(server, jid: str, headers: dict[str, str]) -> int:
    with pytest.raises(InvalidStatus) as refusal, _ws(server, jid, headers):
        pass
    return refusal.value.response.status_code


def _closed_with(server, jid: str, headers: dict[str, str], first) -> tuple[str, int | None]:
    """The error a refused first message gets, and the close code after it."""
    with _ws(server, jid, headers) as ws:
        ws.send(json.dumps(first))
        error = json.loads(ws.recv(timeout=30))["error"]
        with pytest.raises(ConnectionClosedError):
            ws.recv(timeout=30)
        return error, ws.close_code


def _run(ws, argv, **first) -> tuple[bytes, bytes, dict]:
    ws.send(json.dumps({"argv": argv, **first}))
    ws.send(json.dumps({"eof": True}))
    out = {1: b"", 2: b""}
    for msg in ws:
        if isinstance(msg, bytes):
            out[msg[0]] += msg[1:]
        else:
            return out[1], out[2], json.loads(msg)
    raise AssertionError("closed without an end message")


@pytest.mark.parametrize("runtime_name", ["local", "container"], indirect=True)
def test_caldera_exec_runs_in_the_job_as_its_uid(server, tmp_path, runtime_name) -> None:
    alice = _user(server, "alice")
    jid = _sleeper(server, alice)
    config = _login(server, tmp_path, "alice")
    r = _caldera(server, "exec", jid, "--", "sh", "-c", "id -u; id -G; echo to-stderr >&2; exit 3", config=config)
    assert r.returncode == 3, (r.stdout, r.stderr)
    uid = _os_uid(server, "alice")
    assert uid != 0 and r.stdout.split()[0] == str(uid), r.stdout
    assert "0" not in r.stdout.split()[1:], r.stdout  # no root group either
    assert "to-stderr" in r.stderr and "to-stderr" not in r.stdout
    r = _caldera(server, "exec", "-i", jid, "--", "tr", "a-z", "A-Z", stdin="piped in\n", config=config)
    assert (r.returncode, r.stdout) == (0, "PIPED IN\n"), r.stderr
    big = "x" * (8 * 2**20)  # more than any pipe holds: the relay waits for the command instead of failing
    r = _caldera(server, "exec", "-i", jid, "--", "wc", "-c", stdin=big, config=config)
    assert (r.returncode, r.stdout.strip()) == (0, str(len(big))), r.stderr
    # the user's words are the command, never an option of a root helper (nsenter, podman)
    r = _caldera(server, "exec", jid, "--", "--privileged", "--user=0", "id", config=config)
    assert r.returncode in (126, 127) and r.stdout == "", (r.stdout, r.stderr)


def test_others_tokens_and_origins_are_refused(server, tmp_path) -> None:
    alice, bob = _user(server, "alice"), _user(server, "bob")
    jid = _sleeper(server, alice)
    assert _refused(server, jid, bob) == 404  # bob: alice's job does not exist
    assert _refused(server, jid, token(server)) == 404  # an admin acts as nobody else either
    assert _refused(server, "no-such-job", alice) == 404
    assert _refused(server, jid, {}) == 401
    assert _refused(server, jid, {"Authorization": "Bearer not-a-token"}) == 401
    # a page of another site, or of alice's own lab, must not open her terminal, even with her credentials
    for origin in ("http://evil.example", f"http://{jid}.lab.localhost:{server.lab_port}", "null"):
        assert _refused(server, jid, {**alice, "Origin": origin}) == 403, origin
    with _ws(server, jid, {**alice, "Origin": server.url}) as ws:
        assert _run(ws, ["echo", "same origin"])[0] == b"same origin\n"
    # the browser's way: the session cookie, which needs the platform's Origin and the page's CSRF token
    browser = httpx.Client(base_url=server.url)
    r = browser.post("/login", data={"username": "alice", "password": "password-123"}, headers={"Origin": server.url})
    assert r.status_code in (200, 303), r.text
    cookies = "; ".join(f"{k}={v}" for k, v in browser.cookies.items())
    csrf = browser.cookies.get("caldera_csrf")
    assert csrf and "caldera_session" in cookies
    assert _refused(server, jid, {"Cookie": cookies}) == 403  # no Origin
    assert _refused(server, jid, {"Cookie": cookies, "Origin": "http://evil.example"}) == 403
    assert _closed_with(server, jid, {"Cookie": cookies, "Origin": server.url}, {"argv": ["id"]}) == (
        "Forbidden",
        4403,
    )
    with _ws(server, jid, {"Cookie": cookies, "Origin": server.url}) as ws:
        out, _, end = _run(ws, ["echo", "from the page"], csrf=csrf)
        assert (out, end) == (b"from the page\n", {"exit": 0})


def test_a_terminal_resizes_and_ends_with_the_job(server) -> None:
    alice = _user(server, "alice")
    jid = _sleeper(server, alice)
    with _ws(server, jid, alice) as ws:
        ws.send(json.dumps({"argv": ["sh"], "tty": True, "rows": 30, "cols": 90, "term": "xterm-256color"}))
        ws.send(b"stty size; echo $TERM\n")
        seen = b""
        while b"30 90" not in seen or b"xterm-256color\r\n" not in seen:
            seen += ws.recv(timeout=30)[1:]
        ws.send(json.dumps({"resize": [50, 160]}))
        time.sleep(0.3)
        ws.send(b"stty size\n")
        while b"50 160" not in seen:
            seen += ws.recv(timeout=30)[1:]
        r = httpx.post(f"{server.url}/api/v1/jobs/{jid}/cancel", headers=alice)
        assert r.status_code == 200, r.text
        deadline = time.monotonic() + 60
        end = None
        while end is None and time.monotonic() < deadline:
            msg = ws.recv(timeout=60)
            if isinstance(msg, str):
                end = json.loads(msg)
        assert end is not None and "exit" in end or end.get("error") == "JobEnded", end
    # and a job that does not run has no terminal
    until(server, alice, jid, {"Cancelled", "Failed", "Succeeded"})
    assert _refused(server, jid, alice) == 409


def test_bad_first_messages_are_refused(server) -> None:
    alice = _user(server, "alice")
    jid = _sleeper(server, alice)
    for first in ({"argv": []}, {"argv": ["a\0b"]}, {"argv": ["id"], "rank": 1}, {"argv": ["x" * 70000]}, []):
        assert _closed_with(server, jid, alice, first) == ("BadRequest", 4400), first
