"""The datasets and models catalogue and imports from URL, through the API: publishing copies a folder (links a job
planted left out) as a version that never changes; who may read an entry finds it, mounts it by name (read-only),
and nobody else does; a version a running job mounts is not deleted. An import reaches only public addresses
unless an admin allowed a network, resumes after a broken download, and stops at the space's quota. The portal's
folder page publishes and imports through the same API functions."""

from __future__ import annotations

import http.server
import os
import threading
import time

import pytest
from sqlalchemy import delete, select, update

from caldera.db.models import CatalogueEntry, StorageImport
from caldera.server import files, imports
from caldera.storage import fetch
from caldera.storage.backends.local import UPLOADS_DIR
from caldera.storage.catalogue import Catalogue
from tests.conftest import api_on, make_settings, wait_for
from tests.fake_runtime import FakeRuntime
from tests.portal import browser_for, post_form
from tests.test_files_space_jobs import lab
from tests.test_runs import _until

DATA = bytes(range(256)) * 4096  # 1 MiB


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    settings = make_settings(tmp_path_factory.mktemp("catalogue"), storage_import_allowed_networks=["127.0.0.1/32"])
    runtime = FakeRuntime(settings)
    with api_on(settings, runtime) as (api, admin):
        users = lab(api, admin, {"vision": ("alice", "dave"), "other": ("bob",), "third": ("carol",)})
        yield api, users, runtime, settings


def _upload(api, h, space, path, data: bytes):
    r = api.client.post(f"/api/v1/spaces/{space}/uploads", json={"path": path, "size": len(data)}, headers=h)
    r = api.client.patch(f"/api/v1/spaces/{space}/uploads/{r.json()['id']}", content=data,
                         headers={**h, "Upload-Offset": "0"})  # fmt: skip
    assert r.json()["done"], r.text


def _publish(api, h, **body):
    body = {"kind": "dataset", "name": "imagenet-mini", "space": "account:vision", "path": "imagenet", **body}
    return api.client.post("/api/v1/catalogue", json=body, headers=h)


def _ended(api, h, published):
    """The version of a publish's answer (202, copying) once its copy ended: ready or failed."""
    assert published.status_code == 202, published.text
    url = f"/api/v1/catalogue/{published.json()['kind']}/{published.json()['ref']}"

    def ended():
        got = api.client.get(url, headers=h).json()
        return got if got["state"] != "copying" else None

    return wait_for(ended, 30, interval=0.05, what=f"the copy of {url}")


def _published(api, h, **body):
    """Published, and ready."""
    got = _ended(api, h, _publish(api, h, **body))
    assert got["state"] == "ready", got
    return got


def _names(api, h, q=""):
    return [e["ref"] for e in api.client.get("/api/v1/catalogue", params={"q": q}, headers=h).json()]


def _job(api, h, mounts, account):
    spec = {"name": "m", "command": ["sleep", "30"], "mounts": mounts, "account": account}
    return api.client.post("/api/v1/jobs", json=spec, headers=h)


def test_published_versions_are_found_mounted_and_kept_by_who_may_read_them(env):
    api, u, runtime, settings = env
    api.client.post("/api/v1/spaces/account:vision/folders", json={"path": "imagenet"}, headers=u["alice"])
    _upload(api, u["alice"], "account:vision", "imagenet/train.bin", b"v1 bytes")
    planted = settings.spaces_dir / "account" / "vision" / "data" / "imagenet" / "secrets"
    os.symlink("/etc", planted)  # as a job with the space mounted writable could

    got = _published(api, u["alice"], version="v1", description="a small ImageNet", tags=["vision"])
    assert (got["size_bytes"], got["files"], got["source"]) == (8, 1, "account:vision/imagenet")
    assert got["left_out"] == ["secrets: a symbolic link"]
    assert _publish(api, u["alice"], version="v1").status_code == 409  # a version is never replaced
    assert _publish(api, u["dave"], version="v9").status_code == 403  # dave only reads the space
    _upload(api, u["bob"], "personal", "mine.bin", b"bob's")  # a name is its first publisher's
    r = _publish(api, u["bob"], version="v9", space="personal", path="", visibility="public")
    assert r.status_code == 403 and "another user's" in r.text
    _upload(api, u["alice"], "account:vision", "imagenet/val.bin", b"v2")
    _published(api, u["alice"], version="v2", visibility="shared", shared_with=["account:other"])

    # private v1: alice and admins; shared v2: also bob (account other); carol: nothing
    assert _names(api, u["alice"], "imagenet VISION") == ["imagenet-mini@v1"]  # every word must match
    assert _names(api, u["alice"], "imagenet") == ["imagenet-mini@v1", "imagenet-mini@v2"]
    assert _names(api, u["bob"]) == ["imagenet-mini@v2"] and _names(api, u["carol"]) == []
    assert api.client.get("/api/v1/catalogue/dataset/imagenet-mini", headers=u["bob"]).json()["version"] == "v2"
    assert api.client.get("/api/v1/catalogue/dataset/imagenet-mini@v1", headers=u["bob"]).status_code == 404
    # the portal's page says the same, in Chinese too
    browser = browser_for(api.client, "bob", "password-123")
    html = browser.get("/data", params={"q": "imagenet"}).text
    assert 'data-entry="imagenet-mini@v2"' in html and "imagenet-mini@v1" not in html
    assert "{dataset: imagenet-mini@v2, at: /data/imagenet-mini}" in html
    assert "数据集与模型" in browser.get("/data", headers={"Accept-Language": "zh-CN"}).text

    # the copy: v1 as it was, without the link; later changes to the space do not reach it
    store = settings.spaces_dir / "catalogue"
    copies = {p.parent.parent.name: p.parent for p in store.glob("*/data/train.bin")}
    assert len(copies) == 2 and all(not (c / "secrets").exists() for c in copies.values())

    # mounted by name, read-only; refused, with the reason, to who may not read it
    r = _job(api, u["bob"], [{"dataset": "imagenet-mini", "at": "/data/imagenet"}], "other")
    assert r.status_code == 201, r.text
    jid = r.json()["id"]
    _until(api, u["bob"], jid, {"Running"})
    (host, at, rw) = next(req for req in runtime.launched if req.job_id == jid).mounts[0]
    assert (at, rw) == ("/data/imagenet", False) and sorted(os.listdir(host)) == ["train.bin", "val.bin"]
    r = _job(api, u["carol"], [{"dataset": "imagenet-mini", "at": "/data/i"}], "third")
    assert r.json()["errors"] == [{"field": "mounts.0.dataset", "reason": "no dataset imagenet-mini that you may read"}]
    r = _job(api, u["bob"], [{"dataset": "imagenet-mini@v2", "at": "/data/i", "writable": True}], "other")
    assert r.status_code == 400 and "read-only" in r.text

    # a version a running job mounts is not deleted; only its owner or an admin deletes one
    assert api.client.delete("/api/v1/catalogue/dataset/imagenet-mini/v2", headers=u["bob"]).status_code == 403
    r = api.client.delete("/api/v1/catalogue/dataset/imagenet-mini/v2", headers=u["alice"])
    assert r.status_code == 409 and jid in r.json()["detail"], r.text
    api.client.post(f"/api/v1/jobs/{jid}/cancel", headers=u["bob"])
    _until(api, u["bob"], jid, {"Cancelled"})
    assert api.client.delete("/api/v1/catalogue/dataset/imagenet-mini/v2", headers=u["alice"]).status_code == 200
    assert _names(api, u["bob"]) == [] and not os.path.exists(host)


class _Files(http.server.BaseHTTPRequestHandler):
    """``/data``: DATA, with Range; ``/cut``: the first request breaks off half-way, ``/broken``: every one;
    ``/away``: a redirect to a private address; ``/hang``: DATA once ``release`` is set."""

    requests: list[tuple[str, str | None]] = []
    cut_once = True
    release = threading.Event()  # ``/hang`` answers once it is set

    def do_GET(self):  # noqa: N802 - the handler's protocol
        _Files.requests.append((self.path, self.headers.get("Range")))
        if self.path == "/hang":
            _Files.release.wait(30)
        if self.path == "/away":
            self.send_response(302)
            self.send_header("Location", "http://10.1.2.3/data")
            self.end_headers()
            return
        start = int(self.headers["Range"][6:-1]) if self.headers.get("Range") else 0
        self.send_response(206 if start else 200)
        self.send_header("Content-Length", str(len(DATA) - start))
        self.end_headers()
        if self.path == "/broken" or (self.path == "/cut" and _Files.cut_once):
            _Files.cut_once = self.path != "/cut"
            self.wfile.write(DATA[: len(DATA) // 2])
            self.wfile.flush()
            self.connection.shutdown(2)
            return
        self.wfile.write(DATA[start:])

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def files_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Files)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _import(api, h, url, path, space="personal"):
    return api.client.post("/api/v1/imports", json={"url": url, "space": space, "path": path}, headers=h)


def _settled(api, h, import_id):
    deadline = time.monotonic() + 30
    while (got := api.client.get(f"/api/v1/imports/{import_id}", headers=h).json())["state"] == "running":
        assert time.monotonic() < deadline, got
        time.sleep(0.05)
    return got


def test_an_import_reaches_only_what_the_allowlists_let_it(env, files_server):
    api, u, _, _ = env
    port = files_server.rsplit(":", 1)[1]
    for url, why in (
        ("file:///etc/passwd", "only http and https"),
        ("ftp://example.org/x", "only http and https"),
        (f"http://user:pw@127.0.0.1:{port}/data", "credentials"),
        (f"http://127.0.0.2:{port}/data", "non-public"),  # loopback outside the allowed 127.0.0.1/32
        ("http://10.0.0.1/data", "non-public"),
        ("http://169.254.169.254/latest/meta-data", "non-public"),  # a cloud's metadata service
        ("http://[::1]/data", "non-public"),
        ("http://[::ffff:10.0.0.1]/data", "non-public"),
        # IPv6 addresses a gateway turns into a private IPv4 one: NAT64, 6to4, IPv4-translated; and site-local
        ("http://[64:ff9b::a00:1]/data", "non-public"),
        ("http://[2002:a00:1::]/data", "non-public"),
        ("http://[::ffff:0:a00:1]/data", "non-public"),
        ("http://[fec0::1]/data", "non-public"),
        ("http://example.org/données", "ASCII"),  # the request line is ASCII: refused here, not in the thread
    ):
        r = _import(api, u["alice"], url, "x.bin")
        assert r.status_code == 400 and why in r.text, (url, r.text)
    # a length that is a digit to str.isdigit but no number: no total, not a thread that dies
    assert fetch.total_of(type("R", (), {"getheader": lambda self, name, default: "\u00b2"})(), 0) is None
    # a redirect is checked like the first address
    r = _import(api, u["alice"], files_server + "/away", "away.bin")
    assert r.status_code == 201, r.text
    got = _settled(api, u["alice"], r.json()["id"])
    assert got["state"] == "failed" and "10.1.2.3 is a non-public address" in got["error"]
    # a space the user may only read takes no import
    assert _import(api, u["dave"], files_server + "/data", "x.bin", "account:vision").status_code == 403


def test_an_import_resumes_where_it_broke_off_and_stops_at_the_quota(env, files_server):
    api, u, _, _ = env
    alice, admin = u["alice"], u["admin"]
    r = _import(api, alice, files_server + "/cut", "cut.bin")
    first = _settled(api, alice, r.json()["id"])
    assert first["state"] == "failed" and "broke off" in first["error"], first
    listed = api.client.get("/api/v1/spaces/personal/list", headers=alice).json()["entries"]
    assert "cut.bin" not in [e["name"] for e in listed]  # nothing partial is visible
    r = api.client.post(f"/api/v1/imports/{first['id']}/restart", headers=alice)
    assert r.status_code == 200, r.text
    done = _settled(api, alice, first["id"])
    assert done["state"] == "done" and done["done_bytes"] == done["total_bytes"] == len(DATA), done
    assert _Files.requests[-1] == ("/cut", f"bytes={len(DATA) // 2}-")  # asked for the rest only
    r = api.client.get("/api/v1/spaces/personal/files", params={"path": "cut.bin"}, headers=alice)
    assert r.content == DATA
    assert _import(api, alice, files_server + "/data", "cut.bin").status_code == 409  # a name clash

    api.client.patch("/api/v1/spaces/account:vision", json={"quota_bytes": 1000}, headers=admin)
    r = _import(api, alice, files_server + "/data", "big.bin", "account:vision")
    got = _settled(api, alice, r.json()["id"])
    assert got["state"] == "failed" and "larger than" in got["error"], got


def test_unfinished_imports_count_against_the_quota_and_are_swept(env, files_server):
    """A broken import keeps its bytes for a restart, counted against the space's quota; any other failure drops
    them; a day later a broken one's are swept; at startup, part files nothing holds are removed and imports left
    running are failed."""
    api, u, _, settings = env
    carol, admin = u["carol"], u["admin"]
    parts_dir = settings.workspaces / UPLOADS_DIR / "carol"
    api.client.patch("/api/v1/spaces/personal:carol", json={"quota_bytes": len(DATA)}, headers=admin)
    broken = _settled(api, carol, _import(api, carol, files_server + "/broken", "b.bin").json()["id"])
    assert broken["state"] == "failed" and broken["done_bytes"] == len(DATA) // 2, broken
    assert os.listdir(parts_dir) == [broken["id"]]
    r = api.client.post("/api/v1/spaces/personal/uploads", json={"path": "u.bin", "size": len(DATA) // 2 + 1},
                        headers=carol)  # fmt: skip
    assert r.status_code == 409 and "unfinished imports" in r.text, r.text
    other = _settled(api, carol, _import(api, carol, files_server + "/data", "d.bin").json()["id"])
    assert other["state"] == "failed" and "larger than" in other["error"] and other["done_bytes"] == 0, other
    assert os.listdir(parts_dir) == [broken["id"]]  # the refused one left nothing

    spaces = api.client.app.state.spaces
    with api.client.app.state.platform.session() as db:
        spaces.reconcile_due(db, time.time() + 2 * 86400)
    assert os.listdir(parts_dir) == []
    assert api.client.get(f"/api/v1/imports/{broken['id']}", headers=carol).json()["done_bytes"] == 0
    r = api.client.post("/api/v1/spaces/personal/uploads", json={"path": "u.bin", "size": len(DATA) // 2 + 1},
                        headers=carol)  # fmt: skip
    assert r.status_code == 201, r.text

    (parts_dir / ("0" * 32)).write_bytes(b"left by a server that stopped")
    with api.client.app.state.platform.session() as db:
        db.execute(update(StorageImport).where(StorageImport.id == broken["id"]).values(state="running"))
        db.commit()
    imports.recover(api.client.app.state.platform, spaces)
    assert os.listdir(parts_dir) == [r.json()["id"]]  # the upload's part is held; the stray one is gone
    got = api.client.get(f"/api/v1/imports/{broken['id']}", headers=carol).json()
    assert got["state"] == "failed" and "interrupted" in got["error"]


def test_a_user_has_a_few_imports_going_at_once(env, files_server):
    api, u, _, _ = env
    bob = u["bob"]
    try:
        started = [_import(api, bob, files_server + "/hang", f"h{i}.bin") for i in range(4)]
        assert [r.status_code for r in started] == [201] * 4
        r = _import(api, bob, files_server + "/hang", "h5.bin")
        assert r.status_code == 409 and "4 imports running" in r.text
        assert _import(api, u["carol"], files_server + "/data", "c.bin").status_code == 201  # another user's own
    finally:
        _Files.release.set()
    assert all(_settled(api, bob, r.json()["id"])["state"] == "done" for r in started)


def test_where_an_entry_came_from_and_whom_it_is_shared_with_are_its_owners_to_see(env):
    """bob and carol read alice's entries (shared with bob, public): neither learns the space and folder it was
    copied from nor the names it is shared with; alice and an admin do."""
    api, u, _, _ = env
    api.client.post("/api/v1/spaces/account:vision/folders", json={"path": "private-project"}, headers=u["alice"])
    _upload(api, u["alice"], "account:vision", "private-project/w.bin", b"w")
    for name, visibility in (("leaky-shared", "shared"), ("leaky-public", "public")):
        got = _published(api, u["alice"], name=name, version="v1", path="private-project", visibility=visibility,
                         shared_with=["user:bob", "account:third"])  # fmt: skip
        assert got["source"] == "account:vision/private-project", got
    for who, sees in (("bob", False), ("carol", False), ("alice", True), ("admin", True)):
        listed = [e for e in api.client.get("/api/v1/catalogue", params={"q": "leaky"}, headers=u[who]).json()]
        shown = api.client.get("/api/v1/catalogue/dataset/leaky-public", headers=u[who]).json()
        assert listed and all(("source" in e, "shared_with" in e) == (sees, sees) for e in [*listed, shown]), who
        assert sees or "private-project" not in str([*listed, shown])


def test_a_publisher_has_a_number_of_versions_and_bytes_in_the_catalogue(env, monkeypatch):
    api, u, _, settings = env
    dave = u["dave"]  # reads account:vision only: publishes from his own space
    api.client.post("/api/v1/spaces/personal/folders", json={"path": "small"}, headers=dave)
    _upload(api, dave, "personal", "small/s.bin", b"12345")
    api.client.post("/api/v1/spaces/personal/folders", json={"path": "big"}, headers=dave)
    _upload(api, dave, "personal", "big/b.bin", b"123456")
    monkeypatch.setattr(settings, "catalogue_max_entries", 1)
    monkeypatch.setattr(settings, "catalogue_quota_bytes", 10)
    _published(api, dave, name="daves", version="v1", space="personal", path="small")
    r = _publish(api, dave, name="daves", version="v2", space="personal", path="small")
    assert r.status_code == 409 and "1 versions in the catalogue" in r.text, r.text
    monkeypatch.setattr(settings, "catalogue_max_entries", 5)
    store = settings.spaces_dir / "catalogue"
    copies = sorted(store.iterdir())
    # the folder's size is known as it is copied: the copy stops at the bytes left, and says why, in Chinese too
    got = _ended(api, dave, _publish(api, dave, name="daves", version="v2", space="personal", path="big"))
    assert (got["state"], got["size_bytes"], got["error"]["code"]) == ("failed", 0, "CatalogueBytesFull"), got
    assert "may take 10 bytes together and take 5" in got["error"]["reason"]
    # nothing of it is left: its folder goes once the failure is committed (Catalogue.fail), a moment after
    wait_for(lambda: sorted(store.iterdir()) == copies, 10, what="the failed copy's folder removed")
    assert _names(api, dave, "daves") == ["daves@v1", "daves@v2"]  # its publisher sees why
    html = (
        browser_for(api.client, "dave", "password-123")
        .get("/data", params={"q": "daves"}, headers={"Accept-Language": "zh-CN"})
        .text
    )
    assert 'data-entry="daves@v2" data-state="failed"' in html and "你在目录中的各版本合计最多占用 10 字节" in html, (
        html
    )
    r = _job(api, dave, [{"dataset": "daves@v2", "at": "/data/d"}], "vision")
    assert r.status_code == 400 and "daves@v2 was not published: your catalogue versions" in r.text, r.text
    # and its version is free again
    assert _published(api, dave, name="daves", version="v2", space="personal", path="small")["size_bytes"] == 5


def test_two_first_publishes_of_a_name_at_once_make_one_owner(env, monkeypatch):
    """alice and bob publish the same new name at the same moment: both pass the first check; the claim on the
    name lets exactly one through."""
    api, u, _, _ = env
    for who in ("alice", "bob"):
        _upload(api, u[who], "personal", "race.bin", who.encode())
    both_checked = threading.Barrier(2, timeout=10)
    check_new = Catalogue.check_new

    def checked_together(self, *args):
        clash = check_new(self, *args)
        both_checked.wait()
        return clash

    monkeypatch.setattr(Catalogue, "check_new", checked_together)
    statuses = {}

    def publish(who):
        r = _publish(api, u[who], name="raced", version=who, space="personal", path="", visibility="public")
        statuses[who] = r.status_code

    threads = [threading.Thread(target=publish, args=(who,)) for who in ("alice", "bob")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(statuses.values()) == [202, 403], statuses
    owners = {e["owner"] for e in api.client.get("/api/v1/catalogue", params={"q": "raced"}, headers=u["admin"]).json()}
    assert len(owners) == 1


def test_a_removed_entrys_folder_never_blocks_a_publish_and_is_swept(env):
    """An entry's row goes (its owner was deleted, and their entries with them) and its folder stays: SQLite gives
    the next entry the same id, and the next publish must not meet that folder; the sweep removes it."""
    api, u, _, settings = env
    alice = u["alice"]
    api.client.post("/api/v1/spaces/personal/folders", json={"path": "gone"}, headers=alice)
    _upload(api, alice, "personal", "gone/g.bin", b"g")
    _published(api, alice, name="gone", version="v1", space="personal", path="gone")
    platform = api.client.app.state.platform
    with platform.session() as db:
        entry = db.scalar(select(CatalogueEntry).where(CatalogueEntry.name == "gone"))
        left = files.catalogue_for(settings).host_path(entry).parent
        db.execute(delete(CatalogueEntry).where(CatalogueEntry.id == entry.id))  # as a deleted owner's cascade
        db.commit()
    _published(api, alice, name="next", version="v1", space="personal", path="gone")
    with platform.session() as db:
        assert files.catalogue_for(settings).sweep(db, time.time()) == 0  # not yet: an hour at least
        assert files.catalogue_for(settings).sweep(db, time.time() + 7200) == 1
    assert not left.exists()
    assert api.client.get("/api/v1/catalogue/dataset/next", headers=alice).json()["files"] == 1
    assert api.client.delete("/api/v1/catalogue/dataset/next/v1", headers=alice).status_code == 200
    # the name is free again once its last version is gone
    _published(api, u["bob"], name="next", version="v1", space="personal", path="")


def test_the_portals_folder_page_publishes_and_imports_through_the_api(env, files_server):
    """A folder published from its page lists in /data; the API's refusals show on the page, in Chinese too;
    another user finds no such page; an import started there shows its progress until it is done."""
    api, u, _, _ = env
    api.client.post("/api/v1/spaces/personal/folders", json={"path": "portal"}, headers=u["alice"])
    _upload(api, u["alice"], "personal", "portal/w.bin", b"weights")
    alice, bob = (browser_for(api.client, who, "password-123") for who in ("alice", "bob"))
    shown = alice.get("/files/personal:alice", params={"path": "portal"}).text
    assert 'id="publish"' in shown and 'id="import"' in shown
    form = {"path": "portal", "kind": "model", "name": "portal-net", "version": "v1", "visibility": "private",
            "description": "from the portal", "framework": "pytorch"}  # fmt: skip
    assert alice.post("/files/personal:alice/publish", data=form).status_code == 403  # no CSRF token: refused
    r = post_form(alice, "/files/personal:alice/publish", form)
    assert r.status_code == 303 and r.headers["location"] == "/data?q=portal-net", r.text
    assert 'data-entry="portal-net@v1"' in alice.get(r.headers["location"]).text
    entry = wait_for(lambda: (e := api.client.get("/api/v1/catalogue/model/portal-net@v1", headers=u["alice"]).json())
                     ["state"] == "ready" and e, 30, what="portal-net@v1 ready")  # fmt: skip
    assert (entry["source"], entry["files"], entry["framework"]) == ("personal:alice/portal", 1, "pytorch")
    zh = {"Accept-Language": "zh-CN"}
    for body, en, chinese in (
        ({**form, "name": "Bad Name!"}, "must match the pattern", "须符合格式"),
        (form, "portal-net@v1 exists already in the catalogue", "portal-net@v1 已在目录中"),
    ):
        r = post_form(alice, "/files/personal:alice/publish", body)
        assert r.status_code == 400 and en in r.text and 'value="pytorch"' in r.text, r.text  # kept to fix
        assert chinese in post_form(alice, "/files/personal:alice/publish", body, headers=zh).text
    r = post_form(bob, "/files/personal:alice/publish", {**form, "version": "v2"})
    assert r.status_code == 404  # not bob's to read: as the API, no such space
    assert api.client.get("/api/v1/catalogue/model/portal-net@v2", headers=u["alice"]).status_code == 404
    dave = browser_for(api.client, "dave", "password-123")  # reads account:vision, may not change it
    shown = dave.get("/files/account:vision")
    assert shown.status_code == 200 and 'id="publish"' not in shown.text, shown.text[-3000:]
    r = post_form(dave, "/files/account:vision/publish", {**form, "name": "daves-net", "path": ""}, headers=zh)
    assert r.status_code == 400 and "你可以读取 account:vision，但不能更改它" in r.text, r.text

    _Files.release.clear()  # the download waits until the page has shown it running
    try:
        r = post_form(alice, "/files/personal:alice/import",
                      {"folder": "portal", "url": files_server + "/hang", "name": "hung.bin"})  # fmt: skip
        assert r.status_code == 303, r.text
        import_id = r.headers["location"].rpartition("imported=")[2]
        shown = alice.get(r.headers["location"]).text
        assert f'data-import="{import_id}" data-state="running"' in shown
        assert f'hx-get="/partials/imports/{import_id}"' in shown
    finally:
        _Files.release.set()
    assert _settled(api, u["alice"], import_id)["state"] == "done"
    progress = alice.get(f"/partials/imports/{import_id}").text
    assert 'data-state="done"' in progress and "1.0 MiB of 1.0 MiB" in progress and "hx-get" not in progress
    assert "portal/hung.bin" in progress and bob.get(f"/partials/imports/{import_id}").status_code == 404
    r = post_form(alice, "/files/personal:alice/import", {"folder": "portal", "url": "http://10.0.0.1/x", "name": "x"})
    assert r.status_code == 400 and "non-public" in r.text
    r = post_form(alice, "/files/personal:alice/import",
                  {"folder": "portal", "url": files_server + "/data", "name": "hung.bin"}, headers=zh)  # fmt: skip
    assert r.status_code == 400 and "&#39;portal/hung.bin&#39; 已存在" in r.text, r.text


def test_a_succeeded_jobs_output_folder_becomes_a_model_version_that_records_the_job(env):
    """Only the job's owner, only once it has succeeded, only from its workspace; produced_by is never a claim."""
    api, u, _, _ = env
    bob, carol = u["bob"], u["carol"]
    spec = {"name": "train", "command": ["true"], "account": "other"}
    done = api.client.post("/api/v1/jobs", json=spec, headers=bob).json()["id"]
    running = api.client.post("/api/v1/jobs", json={**spec, "command": ["sleep", "30"]}, headers=bob).json()["id"]
    _until(api, bob, done, {"Succeeded"})
    api.client.post("/api/v1/spaces/personal/folders", json={"path": "out"}, headers=bob)
    _upload(api, bob, "personal", "out/model.pt", b"trained")
    body = {"kind": "model", "name": "bobs-net", "version": "v1", "path": "out", "framework": "pytorch"}
    r = api.client.post("/api/v1/catalogue", json={**body, "from_job": done}, headers=bob)
    assert r.status_code == 202, r.text
    got = r.json()
    assert (got["produced_by"], got["framework"], got["source"]) == (done, "pytorch", "personal:bob/out"), got
    for who, extra, status, why in (
        (bob, {"from_job": running, "version": "v2"}, 409, "once it has succeeded"),
        (carol, {"from_job": done, "name": "carols-net"}, 404, "of yours"),  # another user's job
        (bob, {"from_job": done, "version": "v2", "kind": "dataset"}, 400, "only a model"),
        (bob, {"from_job": done, "version": "v2", "space": "account:other"}, 400, "its workspace"),
        (bob, {"produced_by": running, "version": "v2", "space": "personal"}, 400, "produced_by"),  # no claim
    ):
        r = api.client.post("/api/v1/catalogue", json={**body, **extra}, headers=who)
        assert r.status_code == status and why in r.text, (extra, r.text)
    api.client.post(f"/api/v1/jobs/{running}/cancel", headers=bob)
