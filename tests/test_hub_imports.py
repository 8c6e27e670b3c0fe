"""Imports of a Hugging Face-style repository (hf://) from a mirror an admin configured, against a local HTTP server
that serves the Hub's API and resolve paths: a model and a dataset keep their sub-folders, a revision is asked at
its commit, a file name that leaves the folder refuses the repository, no mirror refuses the source, the quota stops
it between files and a broken download resumes where it broke off; the portal shows each file's progress."""

from __future__ import annotations

import http.server
import json
import os
import threading
import time
from urllib.parse import unquote, urlsplit

import pytest

from caldera.storage import fetch, hub
from caldera.storage.backends.local import UPLOADS_DIR
from tests.conftest import api_on, make_settings
from tests.fake_runtime import FakeRuntime
from tests.portal import browser_for, post_form
from tests.test_files_space_jobs import lab

DATA = bytes(range(256)) * 4096  # 1 MiB
SHA = "0123456789abcdef0123456789abcdef01234567"
# (api kind, owner/name, revision): (commit it names or None, {file: bytes}, whether sizes are stated)
REPOS: dict[tuple[str, str, str], tuple[str | None, dict[str, bytes], bool]] = {
    ("models", "lab/tiny-net", "main"): (SHA, {"config.json": b'{"layers": 2}', "weights/part-1.bin": DATA}, True),
    ("models", "lab/tiny-net", "v2"): (None, {"config.json": b'{"layers": 3}'}, True),
    ("datasets", "lab/squad-mini", "main"): (None, {"README.md": b"# squad", "train/a b.csv": b"q,a\n1,2\n"}, False),
    ("models", "lab/evil", "main"): (None, {"ok.txt": b"ok", "../escape.txt": b"gotcha"}, True),
    ("models", "lab/big", "main"): (None, {"small.bin": b"s" * 1000, "big.bin": DATA, "after.bin": b"a"}, False),
    ("models", "lab/cut", "main"): (None, {"first.bin": b"1" * 10, "cut.bin": DATA}, True),
    ("models", "lab/away", "main"): (None, {"away.bin": b"x"}, True),
}


class _Mirror(http.server.BaseHTTPRequestHandler):
    requests: list[tuple[str, str | None]] = []
    cut_once = True
    hold = threading.Event()  # set: files wait for ``release``
    release = threading.Event()

    def do_GET(self):  # noqa: N802 - the handler's protocol
        _Mirror.requests.append((self.path, self.headers.get("Range")))
        path = urlsplit(self.path).path
        parts = path.strip("/").split("/")
        if parts[0] == "api":  # /api/{kind}/{owner}/{name}/revision/{rev}
            kind, repo, rev = parts[1], "/".join(parts[2:4]), unquote(parts[5])
            found = REPOS.get((kind, repo, rev))
            if found is None:
                return self._send(404, b"no such repository")
            commit, files, sized = found
            siblings = [{"rfilename": n, **({"size": len(b)} if sized else {})} for n, b in files.items()]
            return self._send(200, json.dumps({"id": repo, "sha": commit, "siblings": siblings}).encode())
        kind = "datasets" if parts[0] == "datasets" else "models"
        parts = parts[1:] if kind == "datasets" else parts
        repo, rev, name = "/".join(parts[:2]), unquote(parts[3]), unquote("/".join(parts[4:]))
        if _Mirror.hold.is_set():
            _Mirror.release.wait(30)
        if repo == "lab/away":
            self.send_response(302)
            self.send_header("Location", "http://10.1.2.3/x")
            self.end_headers()
            return
        for (k, r, branch), (commit, files, _) in REPOS.items():
            if (k, r) == (kind, repo) and rev in (branch, commit) and name in files:
                return self._file(files[name], cut=name == "cut.bin")
        self._send(404, b"no such file")

    def _file(self, body: bytes, cut: bool):
        start = int(self.headers["Range"][6:-1]) if self.headers.get("Range") else 0
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(len(body) - start))
        self.end_headers()
        if cut and _Mirror.cut_once:
            _Mirror.cut_once = False
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.connection.shutdown(2)
            return
        self.wfile.write(body[start:])

    def _send(self, status: int, body: bytes):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Mirror)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    mirror = f"http://127.0.0.1:{server.server_address[1]}/"
    settings = make_settings(
        tmp_path_factory.mktemp("hub"), storage_import_allowed_networks=["127.0.0.1/32"], huggingface_mirror_url=mirror
    )
    with api_on(settings, FakeRuntime(settings)) as (api, admin):
        users = lab(api, admin, {"vision": ("alice", "dave"), "other": ("bob",), "third": ("carol",)})
        yield api, users, settings
    server.shutdown()


def _import(api, h, url, path, space="personal"):
    return api.client.post("/api/v1/imports", json={"url": url, "space": space, "path": path}, headers=h)


def _settled(api, h, import_id):
    deadline = time.monotonic() + 60
    while (got := api.client.get(f"/api/v1/imports/{import_id}", headers=h).json())["state"] == "running":
        assert time.monotonic() < deadline, got
        time.sleep(0.05)
    return got


def _read(api, h, path, space="personal"):
    return api.client.get(f"/api/v1/spaces/{space}/files", params={"path": path}, headers=h)


def test_a_model_and_a_dataset_come_with_their_folders_at_the_revision_asked(env):
    api, u, _ = env
    alice = u["alice"]
    r = _import(api, alice, "hf://lab/tiny-net", "tiny")
    assert r.status_code == 201 and r.json()["url"] == "hf://lab/tiny-net@main", r.text
    got = _settled(api, alice, r.json()["id"])
    assert got["state"] == "done" and got["files_done"] == 2, got
    assert got["done_bytes"] == got["total_bytes"] == len(DATA) + 13, got
    assert [f["path"] for f in got["files"]] == ["tiny/config.json", "tiny/weights/part-1.bin"]
    assert _read(api, alice, "tiny/weights/part-1.bin").content == DATA
    assert _read(api, alice, "tiny/config.json").content == b'{"layers": 2}'
    asked = [p for p, _ in _Mirror.requests if "/resolve/" in p]
    assert f"/lab/tiny-net/resolve/{SHA}/weights/part-1.bin" in asked  # at the commit the listing named
    assert "/api/models/lab/tiny-net/revision/main?blobs=true" in [p for p, _ in _Mirror.requests]

    got = _settled(api, alice, _import(api, alice, "hf://lab/tiny-net@v2", "tiny-v2").json()["id"])
    assert got["state"] == "done" and _read(api, alice, "tiny-v2/config.json").content == b'{"layers": 3}', got

    r = _import(api, alice, "hf://datasets/lab/squad-mini", "squad", "account:vision")
    got = _settled(api, alice, r.json()["id"])
    assert got["state"] == "done" and got["total_bytes"] == 15, got  # sizes unstated: known from each download
    assert _read(api, alice, "squad/train/a b.csv", "account:vision").content == b"q,a\n1,2\n"
    assert "/datasets/lab/squad-mini/resolve/main/train/a%20b.csv" in [p for p, _ in _Mirror.requests]
    assert _import(api, alice, "hf://lab/tiny-net", "squad", "account:vision").status_code == 409  # taken
    assert _import(api, u["dave"], "hf://lab/tiny-net", "t", "account:vision").status_code == 403  # read-only
    other = api.client.get(f"/api/v1/imports/{r.json()['id']}", headers=u["bob"])
    assert other.status_code == 404  # another user's import


def test_sources_and_file_names_are_checked_and_no_mirror_refuses(env, monkeypatch):
    api, u, settings = env
    alice = u["alice"]
    for source in ("hf://lab", "hf://lab/../etc", "hf://lab/x@..", "hf://lab/x@a b", "hf://spaces/lab/x/y",
                   "hf://-lab/x", "hf://lab/x@main/../../y", "hf://datasets/lab/x/extra"):  # fmt: skip
        r = _import(api, alice, source, "x")
        assert r.status_code == 400 and r.json()["errors"][0]["code"] == "HubBadSource", (source, r.text)
    for name in ("../escape.txt", "/etc/passwd", "a/../../b", "a\\..\\b", "a//b", "a/", "./a", "a\x00b", "", 7,
                 "a\nb", "a/./b", None):  # fmt: skip
        with pytest.raises(fetch.FetchFailed):
            hub.check_name(name)
    hub.check_name("weights/model-00001-of-00002.safetensors")
    with pytest.raises(fetch.FetchFailed, match="twice"):
        hub.listing(json.dumps({"siblings": [{"rfilename": "a"}, {"rfilename": "a/b"}]}).encode())
    with pytest.raises(fetch.FetchFailed, match="no list of files"):
        hub.listing(b'{"siblings": "all"}')
    monkeypatch.setattr(hub, "MAX_FILES", 1)
    with pytest.raises(fetch.FetchFailed, match="more than 1 files"):
        hub.listing(json.dumps({"siblings": [{"rfilename": "a"}, {"rfilename": "b"}]}).encode())
    monkeypatch.setattr(hub, "MAX_LISTING_BYTES", 10)
    got = _settled(api, alice, _import(api, alice, "hf://lab/tiny-net", "capped").json()["id"])
    assert got["state"] == "failed" and "larger than 10 bytes" in got["error"], got
    monkeypatch.undo()

    got = _settled(api, alice, _import(api, alice, "hf://lab/evil", "evil").json()["id"])
    assert got["state"] == "failed" and 'refused: "../escape.txt"' in got["error"] and got["files"] == [], got
    assert _read(api, alice, "escape.txt").status_code == 404 and _read(api, alice, "evil/ok.txt").status_code == 404
    got = _settled(api, alice, _import(api, alice, "hf://lab/nothing", "nothing").json()["id"])
    assert got["state"] == "failed" and "404" in got["error"], got
    got = _settled(api, alice, _import(api, alice, "hf://lab/away", "away").json()["id"])  # a redirect, checked
    assert got["state"] == "failed" and "10.1.2.3 is a non-public address" in got["error"], got

    monkeypatch.setattr(settings, "huggingface_mirror_url", "")
    r = _import(api, alice, "hf://lab/tiny-net", "off")
    assert r.status_code == 400 and r.json()["errors"][0]["code"] == "HubNoMirror", r.text
    r = api.client.post(f"/api/v1/imports/{got['id']}/restart", headers=alice)
    assert r.status_code == 400 and "huggingface_mirror_url" in r.text
    monkeypatch.setattr(settings, "huggingface_mirror_url", "http://10.0.0.1")  # a private mirror not allowed
    r = _import(api, alice, "hf://lab/tiny-net", "private")
    assert r.status_code == 400 and "non-public" in r.text


def test_the_quota_stops_a_repository_between_files_and_a_broken_file_resumes(env):
    api, u, settings = env
    bob, admin = u["bob"], u["admin"]
    parts_dir = settings.workspaces / UPLOADS_DIR / "bob"
    api.client.patch("/api/v1/spaces/personal:bob", json={"quota_bytes": 100_000}, headers=admin)
    got = _settled(api, bob, _import(api, bob, "hf://lab/big", "big").json()["id"])
    assert got["state"] == "failed" and "larger than" in got["error"], got
    assert [f["state"] for f in got["files"]] == ["done", "failed", "queued"], got
    assert _read(api, bob, "big/small.bin").content == b"s" * 1000 and _read(api, bob, "big/big.bin").status_code == 404
    assert os.listdir(parts_dir) == []  # nothing of the refused file is kept
    # stated sizes that cannot fit: refused before a byte is fetched
    got = _settled(api, bob, _import(api, bob, "hf://lab/tiny-net", "tiny").json()["id"])
    assert got["state"] == "failed" and "the space has room for" in got["error"] and got["files"] == [], got
    api.client.patch("/api/v1/spaces/personal:bob", json={"quota_bytes": 10 * len(DATA)}, headers=admin)

    first = _settled(api, bob, _import(api, bob, "hf://lab/cut", "cut").json()["id"])
    assert first["state"] == "failed" and "broke off" in first["error"], first
    assert [(f["state"], f["done_bytes"]) for f in first["files"]] == [("done", 10), ("failed", len(DATA) // 2)]
    file_id = first["files"][1]["id"]
    r = api.client.post(f"/api/v1/imports/{file_id}/restart", headers=bob)  # a file restarts its repository's
    assert r.status_code == 200 and r.json()["id"] == first["id"], r.text
    done = _settled(api, bob, first["id"])
    assert done["state"] == "done" and done["done_bytes"] == done["total_bytes"] == len(DATA) + 10, done
    assert _Mirror.requests[-1] == ("/lab/cut/resolve/main/cut.bin", f"bytes={len(DATA) // 2}-")  # the rest only
    assert _read(api, bob, "cut/cut.bin").content == DATA
    assert api.client.post(f"/api/v1/imports/{first['id']}/restart", headers=bob).status_code == 409  # done


def test_the_portal_imports_a_repository_and_shows_each_file(env):
    api, u, _ = env
    carol = browser_for(api.client, "carol", "password-123")
    shown = carol.get("/files/personal:carol").text
    assert 'id="import-hf"' in shown
    _Mirror.release.clear()
    _Mirror.hold.set()
    try:
        r = post_form(carol, "/files/personal:carol/import", {"folder": "", "url": "hf://lab/tiny-net", "name": "net"})
        assert r.status_code == 303, r.text
        import_id = r.headers["location"].rpartition("imported=")[2]
        shown = carol.get(r.headers["location"]).text
        assert f'data-import="{import_id}" data-state="running"' in shown
    finally:
        _Mirror.hold.clear()
        _Mirror.release.set()
    assert _settled(api, u["carol"], import_id)["state"] == "done"
    progress = carol.get(f"/partials/imports/{import_id}").text
    assert "2 of 2 files" in progress and 'data-file="net/weights/part-1.bin" data-state="done"' in progress
    assert "Open the folder" in progress and "hx-get" not in progress
    zh = {"Accept-Language": "zh-CN"}
    r = post_form(carol, "/files/personal:carol/import", {"folder": "", "url": "hf://lab", "name": "x"}, headers=zh)
    assert r.status_code == 400 and "不是仓库" in r.text, r.text
    r = post_form(carol, "/files/personal:carol/import", {"folder": "", "url": "hf://lab/evil", "name": "ev"})
    evil = r.headers["location"].rpartition("imported=")[2]
    _settled(api, u["carol"], evil)
    assert "镜像列出了一个被拒绝的文件名" in carol.get(f"/partials/imports/{evil}", headers=zh).text


def test_the_cli_names_a_repositorys_folder_after_it():
    from caldera.cli.catalogue import _default_name

    assert _default_name("hf://lab/tiny-net") == "tiny-net"
    assert _default_name("hf://datasets/lab/squad-mini@refs/pr/1") == "squad-mini"
    assert _default_name("https://example.org/w/model.bin?x=1") == "model.bin"
