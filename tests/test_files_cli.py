"""`caldera files` and the SDK's file calls against a real server process: put with a progress bar, ls, get, mv,
rm, a clash as an error, and an upload interrupted halfway (between chunks, or with a chunk's connection broken) that
the next `put` resumes."""

from __future__ import annotations

import json
import os
import socket
import time
from urllib.parse import urlsplit

import pytest

from caldera.client import Client, Conflict
from tests.test_server_process import cli


@pytest.fixture
def sdk(server, monkeypatch):
    cli(server, "login", "--url", server.url, "-u", "admin", "-p", "admin-password")
    monkeypatch.setenv("CALDERA_CONFIG_DIR", server.env["CALDERA_CONFIG_DIR"])
    with Client() as c:
        yield c


def test_files_cli_round_trip(server, sdk, tmp_path):
    data = os.urandom(3 * 2**20 + 5)
    src = tmp_path / "weights.bin"
    src.write_bytes(data)
    cli(server, "files", "mkdir", "-p", "models/v1")
    out = cli(server, "files", "put", str(src), "models/v1/", "--chunk-mib", "1")
    assert "uploaded" in out.stdout
    listed = json.loads(cli(server, "files", "ls", "models/v1", "-o", "json").stdout)
    assert [(e["name"], e["kind"], e["size"]) for e in listed] == [("weights.bin", "file", len(data))]
    clash = cli(server, "files", "put", str(src), "models/v1/weights.bin", check=False)
    assert clash.returncode == 1 and "already exists" in clash.stderr
    cli(server, "files", "mv", "models/v1/weights.bin", "models/best.bin")
    dst = tmp_path / "back.bin"
    cli(server, "files", "get", "models/best.bin", str(dst))
    assert dst.read_bytes() == data
    spaces = json.loads(cli(server, "files", "spaces", "-o", "json").stdout)
    assert spaces[0]["space"] == "personal:admin" and spaces[0]["used_bytes"] == len(data)
    assert "removed models" in cli(server, "files", "rm", "models").stdout
    assert json.loads(cli(server, "files", "ls", "-o", "json").stdout) == []
    bad = cli(server, "files", "ls", "../etc", check=False)
    assert bad.returncode == 1 and "'..'" in bad.stderr
    public = cli(server, "files", "put", str(src), "shared.bin", "--space", "public")
    assert public.returncode == 0 and sdk.space("public")["used_files"] == 1


def test_an_interrupted_upload_resumes(server, sdk, tmp_path):
    chunk = 2**20
    data = os.urandom(4 * chunk + 17)
    src = tmp_path / "big.bin"
    src.write_bytes(data)
    seen: list[int] = []

    def stop_after_two(done: int, total: int) -> None:
        seen.append(done)
        if done >= 2 * chunk:
            raise KeyboardInterrupt  # the laptop's lid closes

    with pytest.raises(KeyboardInterrupt):
        sdk.upload(src, "big.bin", chunk_bytes=chunk, progress=stop_after_two)
    assert [e["name"] for e in sdk.ls()] == []  # nothing visible yet
    seen.clear()
    sdk.upload(src, "big.bin", chunk_bytes=chunk, progress=lambda done, total: seen.append(done))
    assert seen == [3 * chunk, 4 * chunk, len(data)]  # only the missing chunks were sent
    back = tmp_path / "back.bin"
    sdk.download("big.bin", back)
    assert back.read_bytes() == data
    with pytest.raises(Conflict):
        sdk.upload(src, "big.bin")


def test_a_chunk_whose_connection_breaks_keeps_what_arrived(server, sdk, tmp_path):
    """A client that dies partway through a chunk's body: the bytes the server received are written (before, only
    whole 8 MiB batches were, and this chunk left nothing), the upload says where it stands, and the rest sent from
    there makes the file."""
    mib = 2**20
    data = os.urandom(4 * mib + 77)
    upload = sdk.post("/spaces/personal/uploads", {"path": "half.bin", "size": len(data)})
    path = f"/spaces/personal/uploads/{upload['id']}"
    sent = 3 * mib  # of the chunk's 4 MiB
    where = urlsplit(server.url)
    with socket.create_connection((where.hostname, where.port)) as conn:
        conn.sendall(
            f"PATCH /api/v1{path} HTTP/1.1\r\nHost: {where.netloc}\r\n"
            f"Authorization: {sdk.http.headers['authorization']}\r\nUpload-Offset: 0\r\n"
            f"Content-Length: {len(data)}\r\n\r\n".encode()
            + data[:sent]
        )
    offsets = [sdk.get(path)["offset"]]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # until the server has written what it got (a slow start is no end)
        time.sleep(0.5)
        offsets.append(sdk.get(path)["offset"])
        if offsets[-1] == offsets[-2] > 2.5 * mib:
            break
    # uvicorn drops what it holds unread when the connection goes: at most a read and 64 KiB short of what was sent
    assert 2.5 * mib < offsets[-1] <= sent
    assert [e["name"] for e in sdk.ls()] == []  # nothing visible before the last byte
    rest = sdk.http.patch(f"/api/v1{path}", content=data[offsets[-1] :], headers={"Upload-Offset": str(offsets[-1])})
    assert rest.status_code == 200 and rest.json()["done"]
    back = tmp_path / "back.bin"
    sdk.download("half.bin", back)
    assert back.read_bytes() == data


def test_a_20_mib_chunk_and_a_download_read_from_the_connection(server, sdk, tmp_path):
    """One chunk of 20 MiB and 3 bytes, which the server writes in pieces as it arrives, comes back byte for
    byte through the SDK's download (read from the connection past h11, a mebibyte at a time); the SDK goes on with
    its next call on a new connection."""
    data = os.urandom(20 * 2**20 + 3)
    src = tmp_path / "one.bin"
    src.write_bytes(data)
    seen: list[int] = []
    sdk.upload(src, "one.bin", chunk_bytes=32 * 2**20, progress=lambda done, total: seen.append(done))
    assert seen == [len(data)]
    back = tmp_path / "back.bin"
    progress: list[int] = []
    sdk.download("one.bin", back, progress=lambda done, total: progress.append(done))
    assert back.read_bytes() == data
    assert progress[-1] == len(data) and len(progress) > 10
    assert [(e["name"], e["size"]) for e in sdk.ls()] == [("one.bin", len(data))]
