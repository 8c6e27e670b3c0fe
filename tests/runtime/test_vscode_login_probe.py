"""The platform's login to a session server is a request to a server the job controls: it must never hold the
caller (the scheduling loop observes under the platform's state lock), and must end by one deadline however the
server answers: not at all, a byte at a time, or without end."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from caldera.runtime.local import code_server
from caldera.runtime.local.rundir import RunDir
from caldera.runtime.local.session_servers import SessionLogins

_COOKIE_HEADERS = b"HTTP/1.1 302 Found\r\nSet-Cookie: code-server-session=s3cret; Path=/\r\n"


def _answer(conn: socket.socket, how: str, stop: threading.Event) -> None:
    try:
        _speak(conn, how, stop)
    except OSError:  # the client gave up: what it should
        pass


def _speak(conn: socket.socket, how: str, stop: threading.Event) -> None:
    conn.recv(65536)  # the login request
    if how == "login":
        conn.sendall(_COOKIE_HEADERS + b"Content-Length: 0\r\n\r\n")
    elif how == "endless body":  # a complete head with the cookie, then a body that never ends
        conn.sendall(_COOKIE_HEADERS + b"Transfer-Encoding: chunked\r\n\r\n")
        while not stop.is_set():
            conn.sendall(b"10000\r\n" + b"x" * 0x10000 + b"\r\n")
    elif how == "trickle":  # a header line now and then, each well within any per-read timeout
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        while not stop.wait(0.2):
            conn.sendall(b"X-Slow: 1\r\n")
    stop.wait()  # "hang": answers nothing


@pytest.fixture
def fake_server(tmp_path: Path) -> Iterator:
    """``fake_server(how)``: a code-server stand-in on a Unix socket, as a job's socket is; its path."""
    stop, made = threading.Event(), []

    def serve(how: str) -> str:
        path = str(tmp_path / f"{how.replace(' ', '-')}.sock")
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(path)
        srv.listen()
        made.append(srv)

        def loop() -> None:
            while True:
                try:
                    conn, _ = srv.accept()
                except OSError:
                    return
                made.append(conn)
                threading.Thread(target=_answer, args=(conn, how, stop), daemon=True).start()

        threading.Thread(target=loop, daemon=True).start()
        return path

    yield serve
    stop.set()
    for s in made:
        s.close()


def _job(tmp_path: Path, name: str, sock: str) -> tuple[dict, RunDir]:
    run = tmp_path / "runs" / name
    run.mkdir(parents=True)
    rd = RunDir(run)
    return {"kind": "vscode", "socket": sock, "scratch": str(tmp_path), "base_url": "/"}, rd


def test_a_login_ends_by_one_deadline_and_reads_no_body(fake_server) -> None:
    t0 = time.monotonic()
    assert code_server.login(fake_server("trickle"), "the-password", timeout_s=0.5) is None
    assert code_server.login(fake_server("hang"), "the-password", timeout_s=0.5) is None
    assert time.monotonic() - t0 < 10  # per-read timeouts alone: a trickle holds it for as long as it goes on
    # the head is all a login needs: an endless body is never read
    assert code_server.login(fake_server("endless body"), "the-password") == "code-server-session=s3cret"


def test_a_server_that_hangs_holds_neither_the_loop_nor_other_jobs(fake_server, tmp_path, monkeypatch):
    monkeypatch.setattr(code_server, "LOGIN_TIMEOUT_S", 60.0)  # a hang would show as a minute
    logins = SessionLogins()  # what both runtimes log in with
    hung, rd = _job(tmp_path, "hung", fake_server("hang"))
    t0 = time.monotonic()
    for _ in range(3):  # the loop's observe, under the state lock: never waits, one probe at a time
        assert logins.login(("hung", 1), hung, rd, "the-password") is None
    assert time.monotonic() - t0 < 30
    assert [t.name for t in threading.enumerate()].count("login-probe ('hung', 1)") == 1

    fine, rd2 = _job(tmp_path, "fine", fake_server("login"))  # another job's login, meanwhile: the proxy waits for it
    assert logins.login(("fine", 1), fine, rd2, "the-password", wait_s=30) == "code-server-session=s3cret"
    assert logins.endpoint(("hung", 1), hung, rd, "the-password") == []
