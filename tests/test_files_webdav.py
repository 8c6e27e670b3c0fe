"""WebDAV against a real server process with a real client (rclone): a personal token as the password, copy up and
down, move and delete, every permission rule of the API, the quota (an overrun leaves nothing), and links a job
planted that the client never sees through."""

from __future__ import annotations

import os
import shutil
import subprocess

import httpx
import pytest

from tests.test_server_process import token

pytestmark = pytest.mark.skipif(shutil.which("rclone") is None, reason="rclone not installed")


def personal_token(server, username: str) -> str:
    h = token(server, username, "password-123")
    r = httpx.post(f"{server.url}/api/v1/tokens", json={"name": "dav"}, headers=h)
    assert r.status_code == 201, r.text
    return r.json()["token"]


def rclone(server, tmp_path, user: str, secret: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    obscured = subprocess.run(["rclone", "obscure", secret], capture_output=True, text=True, check=True).stdout.strip()
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "RCLONE_CONFIG": str(tmp_path / "rclone.conf"),
        "RCLONE_CONFIG_CAL_TYPE": "webdav",
        "RCLONE_CONFIG_CAL_URL": f"{server.url}/dav",
        "RCLONE_CONFIG_CAL_VENDOR": "other",
        "RCLONE_CONFIG_CAL_USER": user,
        "RCLONE_CONFIG_CAL_PASS": obscured,
    }
    r = subprocess.run(["rclone", "--retries", "1", "--low-level-retries", "1", *args], env=env, capture_output=True,
                       text=True, timeout=120)  # fmt: skip
    if check:
        assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r


def test_webdav_with_rclone(server, tmp_path):
    admin = token(server)
    for name in ("alice", "bob"):
        r = httpx.post(f"{server.url}/api/v1/users", json={"username": name, "password": "password-123"}, headers=admin)
        assert r.status_code == 201
    httpx.post(f"{server.url}/api/v1/accounts", json={"name": "vision"}, headers=admin)
    httpx.post(f"{server.url}/api/v1/accounts/vision/members", json={"username": "alice"}, headers=admin)
    alice, bob = personal_token(server, "alice"), personal_token(server, "bob")

    up = tmp_path / "up"
    (up / "sub").mkdir(parents=True)
    data = os.urandom(3 * 2**20)
    (up / "sub" / "weights.bin").write_bytes(data)
    (up / "notes ü.txt").write_text("odd name\n")
    rclone(server, tmp_path, "alice", alice, "copy", str(up), "cal:personal:alice/proj")
    listed = rclone(server, tmp_path, "alice", alice, "lsf", "-R", "cal:personal:alice/proj").stdout.splitlines()
    assert sorted(listed) == ["notes ü.txt", "sub/", "sub/weights.bin"]
    down = tmp_path / "down"
    rclone(server, tmp_path, "alice", alice, "copy", "cal:personal:alice/proj", str(down))
    assert (down / "sub" / "weights.bin").read_bytes() == data
    assert (down / "notes ü.txt").read_text() == "odd name\n"
    rclone(server, tmp_path, "alice", alice, "moveto", "cal:personal:alice/proj/sub/weights.bin",
           "cal:personal:alice/proj/w.bin")  # fmt: skip
    got = rclone(server, tmp_path, "alice", alice, "lsf", "cal:personal:alice/proj").stdout.split("\n")
    assert "w.bin" in got and "sub/" in got
    # the API counted what came through WebDAV
    space = httpx.get(f"{server.url}/api/v1/spaces/personal:alice", headers=token(server, "alice", "password-123"))
    assert space.json()["used_bytes"] == len(data) + len("odd name\n")

    # the account's space: alice (a member) writes, bob (not one) neither reads nor writes
    rclone(server, tmp_path, "alice", alice, "copyto", str(up / "notes ü.txt"), "cal:account:vision/readme.txt")
    assert rclone(server, tmp_path, "bob", bob, "lsf", "cal:account:vision", check=False).returncode != 0
    assert rclone(server, tmp_path, "bob", bob, "lsf", "cal:personal:alice", check=False).returncode != 0
    r = rclone(server, tmp_path, "bob", bob, "copyto", str(up / "notes ü.txt"), "cal:account:vision/x", check=False)
    assert r.returncode != 0
    # the public space: everyone reads, only admins write
    assert rclone(server, tmp_path, "bob", bob, "lsf", "cal:public").returncode == 0
    r = rclone(server, tmp_path, "bob", bob, "copyto", str(up / "notes ü.txt"), "cal:public/x", check=False)
    assert r.returncode != 0
    # a wrong password, or a token used with another user's name
    assert rclone(server, tmp_path, "alice", "cal_wrong", "lsf", "cal:", check=False).returncode != 0
    assert rclone(server, tmp_path, "alice", bob, "lsf", "cal:", check=False).returncode != 0
    r = httpx.request("PROPFIND", f"{server.url}/dav/", auth=("alice", "password-123"), headers={"Depth": "1"})
    assert r.status_code == 401  # the password is not a token
    r = httpx.request("PROPFIND", f"{server.url}/dav/personal/", auth=("alice", alice), headers={"Depth": "infinity"})
    assert r.status_code == 403  # a whole space in one request: refused
    # a member's page or script is served as opaque bytes, never run on the platform's origin
    page = b"<script>fetch('/api/v1/tokens', {method: 'POST'})</script>"
    url = f"{server.url}/dav/account:vision/evil.html"
    assert httpx.put(url, content=page, auth=("alice", alice)).status_code == 201
    r = httpx.get(url, auth=("alice", alice))
    assert r.content == page and r.headers["content-type"] == "application/octet-stream"
    assert r.headers["x-content-type-options"] == "nosniff" and "sandbox" in r.headers["content-security-policy"]
    dest = {"Destination": f"{server.url}/dav/account:vision/w.bin"}
    r = httpx.request("MOVE", f"{server.url}/dav/personal:alice/proj/w.bin", auth=("alice", alice), headers=dest)
    assert r.status_code == 403  # moves stay inside one space

    # links a job planted in alice's space are neither listed nor read
    home = server.data_dir / "workspaces" / "alice"
    os.symlink("/etc", home / "etc")
    os.symlink(server.data_dir / "workspaces" / "bob", home / "bob")
    listed = rclone(server, tmp_path, "alice", alice, "lsf", "cal:personal:alice").stdout.split()
    assert "etc" not in listed and "etc/" not in listed and "bob/" not in listed
    assert rclone(server, tmp_path, "alice", alice, "cat", "cal:personal:alice/etc/passwd", check=False).returncode
    r = httpx.get(f"{server.url}/dav/personal:alice/etc/passwd", auth=("alice", alice))
    assert r.status_code in (400, 404) and "root:" not in r.text

    # a PUT over the quota: refused, nothing left behind
    quota = {"quota_bytes": len(data) + 2**20}
    r = httpx.patch(f"{server.url}/api/v1/spaces/personal:alice", json=quota, headers=admin)
    assert r.status_code == 200
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(2 * 2**20))
    r = rclone(server, tmp_path, "alice", alice, "copyto", str(big), "cal:personal:alice/big.bin", check=False)
    assert r.returncode != 0
    assert "big.bin" not in rclone(server, tmp_path, "alice", alice, "lsf", "cal:personal:alice").stdout
    assert not list((home.parent / ".caldera-uploads" / "alice").iterdir())
    rclone(server, tmp_path, "alice", alice, "purge", "cal:personal:alice/proj")
    assert "proj/" not in rclone(server, tmp_path, "alice", alice, "lsf", "cal:personal:alice").stdout
