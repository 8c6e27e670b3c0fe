"""A WebDAV PUT against a real server process, byte by byte (httpx and a raw socket): what clients rely on (201 and
204, the ETag, If-Match, locks) and what an attacker tries (another user's space, a path out of the space, a body
past the quota or the size limit, a connection dropped halfway). Whatever is refused leaves the old file as it
was, and no part file behind."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from tests.conftest import ServerProcess, free_port, kill_job_processes, server_env, traversable, wait_for
from tests.test_files_webdav import personal_token
from tests.test_server_process import token

MAX_UPLOAD = 8 * 2**20
LOCK = b"""<?xml version="1.0" encoding="utf-8"?>
<D:lockinfo xmlns:D="DAV:"><D:lockscope><D:exclusive/></D:lockscope><D:locktype><D:write/></D:locktype>
<D:owner>alice</D:owner></D:lockinfo>"""


@pytest.fixture
def dav(tmp_path, db_url) -> Iterator[tuple[ServerProcess, str, str]]:
    """A server whose uploads may bring 8 MiB at most; alice's and bob's personal tokens."""
    env = {**server_env(tmp_path, db_url), "CALDERA_STORAGE_MAX_UPLOAD_BYTES": str(MAX_UPLOAD)}
    srv = ServerProcess(traversable(tmp_path) / "data", free_port(), env).start()
    try:
        admin = token(srv)
        for name in ("alice", "bob"):
            r = httpx.post(
                f"{srv.url}/api/v1/users", json={"username": name, "password": "password-123"}, headers=admin
            )
            assert r.status_code == 201, r.text
        yield srv, personal_token(srv, "alice"), personal_token(srv, "bob")
    finally:
        srv.stop()
        kill_job_processes(srv.data_dir)


def pieces(data: bytes, size: int = 100_000) -> Iterator[bytes]:
    """The body sent chunked (no Content-Length), as a client streaming a file of unknown size does."""
    for i in range(0, len(data), size):
        yield data[i : i + size]


def parts_left(srv: ServerProcess, user: str) -> list[Path]:
    return list((srv.data_dir / "workspaces" / ".caldera-uploads" / user).glob("*"))


def test_put_keeps_what_clients_rely_on(dav):
    srv, alice, _ = dav
    url, auth = f"{srv.url}/dav/personal/w.bin", ("alice", alice)
    first = os.urandom(3 * 2**20 + 7)
    r = httpx.put(url, content=pieces(first), auth=auth)
    assert r.status_code == 201, r.text
    etag = r.headers["etag"]
    got = httpx.get(url, auth=auth)
    assert got.content == first and got.headers["etag"] == etag
    assert (srv.data_dir / "workspaces" / "alice" / "w.bin").read_bytes() == first

    second = os.urandom(2**20)
    r = httpx.put(url, content=second, auth=auth)  # with a Content-Length
    assert r.status_code == 204 and r.headers["etag"] != etag
    r = httpx.put(url, content=b"stale", auth=auth, headers={"If-Match": etag})
    assert r.status_code == 412
    r = httpx.put(url, content=b"new", auth=auth, headers={"If-None-Match": "*"})
    assert r.status_code == 412
    assert httpx.get(url, auth=auth).content == second
    r = httpx.put(url, content=b"current", auth=auth, headers={"If-Match": httpx.head(url, auth=auth).headers["etag"]})
    assert r.status_code == 204 and httpx.get(url, auth=auth).content == b"current"
    r = httpx.put(f"{srv.url}/dav/personal/empty", content=b"", auth=auth)
    assert r.status_code == 201 and httpx.get(f"{srv.url}/dav/personal/empty", auth=auth).content == b""

    # a lock: a PUT without its token is refused, with it goes through
    r = httpx.request("LOCK", url, content=LOCK, auth=auth, headers={"Timeout": "Second-60", "Depth": "0"})
    assert r.status_code == 200, r.text
    lock = r.headers["lock-token"]
    assert httpx.put(url, content=b"no token", auth=auth).status_code == 423
    r = httpx.put(url, content=pieces(first), auth=auth, headers={"If": f"({lock})"})
    assert r.status_code == 204 and httpx.get(url, auth=auth).content == first
    assert httpx.request("UNLOCK", url, auth=auth, headers={"Lock-Token": lock}).status_code == 204
    assert parts_left(srv, "alice") == []


@contextmanager
def raw_put(srv: ServerProcess, path: str, auth: httpx.BasicAuth, length: int, sent: bytes) -> Iterator[None]:
    """A PUT that states ``length`` bytes, sends ``sent``, and goes away when the block ends."""
    host, port = urlsplit(srv.url).hostname, urlsplit(srv.url).port
    header = next(auth.auth_flow(httpx.Request("PUT", f"{srv.url}{path}"))).headers["authorization"]
    with socket.create_connection((host, port)) as sock:
        sock.sendall(f"PUT {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: {header}\r\n"
                     f"Content-Length: {length}\r\n\r\n".encode() + sent)  # fmt: skip
        yield


def test_put_refused_leaves_the_old_file(dav, tmp_path):
    srv, alice, bob = dav
    home = srv.data_dir / "workspaces" / "alice"
    url, auth = f"{srv.url}/dav/personal/w.bin", ("alice", alice)
    old = os.urandom(2**20)
    assert httpx.put(url, content=old, auth=auth).status_code == 201

    # a connection dropped halfway: the part received never replaces the file
    with raw_put(srv, "/dav/personal/w.bin", httpx.BasicAuth(*auth), 4 * 2**20, os.urandom(2**20 + 5)):
        wait_for(lambda: parts_left(srv, "alice"), 30, what="the PUT's part begun")
    wait_for(lambda: not parts_left(srv, "alice"), 30, what="the dropped PUT's part gone")
    assert (home / "w.bin").read_bytes() == old

    # past the size limit: stated (refused before anything is read) or streamed
    r = httpx.put(url, content=b"x" * (MAX_UPLOAD + 1), auth=auth)
    assert r.status_code == 413
    r = httpx.put(url, content=pieces(os.urandom(MAX_UPLOAD + 2**20), 2**20), auth=auth)
    assert r.status_code == 413, r.text
    assert (home / "w.bin").read_bytes() == old and parts_left(srv, "alice") == []

    # past the quota halfway through the body
    admin = token(srv)
    r = httpx.patch(f"{srv.url}/api/v1/spaces/personal:alice", json={"quota_bytes": 3 * 2**20}, headers=admin)
    assert r.status_code == 200
    r = httpx.put(url, content=pieces(os.urandom(5 * 2**20)), auth=auth)
    assert r.status_code == 507
    r = httpx.put(f"{srv.url}/dav/personal/new.bin", content=os.urandom(5 * 2**20), auth=auth)
    assert r.status_code == 507
    assert (home / "w.bin").read_bytes() == old and not (home / "new.bin").exists()
    assert parts_left(srv, "alice") == []

    # another user's space, a path out of the space, no credentials
    bob_home = srv.data_dir / "workspaces" / "bob"
    assert httpx.put(f"{srv.url}/dav/personal:alice/b.bin", content=b"b", auth=("bob", bob)).status_code == 403
    for path in ("personal/%2e%2e/bob/x", "personal/..%2fbob%2fx", "personal/sub/%2e%2e/%2e%2e/bob/x"):
        r = httpx.put(f"{srv.url}/dav/{path}", content=b"evil", auth=("alice", alice))
        assert r.status_code in (400, 403, 404, 409), (path, r.status_code)
    assert httpx.put(f"{srv.url}/dav/personal:alice/c.bin", content=b"c").status_code == 401
    assert not (home / "b.bin").exists() and not (home / "c.bin").exists()
    assert not list(bob_home.rglob("x")) and not (srv.data_dir / "workspaces" / "x").exists()
    assert parts_left(srv, "alice") == [] and parts_left(srv, "bob") == []
