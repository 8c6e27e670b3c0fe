"""Storage spaces through the API: every permission rule for the owner, a member (read-write and read-only), a
non-member and an admin; resumable uploads that survive an interruption; quota overruns, name clashes and odd
names that leave nothing behind and never answer 500; and a space in which a job planted links out."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from caldera.storage.backends.local import UPLOADS_DIR
from tests.conftest import Api, make_settings

CHUNK = 64 * 1024


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from caldera.server.app import create_app
    from caldera.server.platform import Platform
    from caldera.server.tenancy import bootstrap

    settings = make_settings(
        tmp_path_factory.mktemp("files"), storage_chunk_bytes=CHUNK, storage_quota_bytes=10 * 2**20
    )
    platform = Platform.create(settings)
    with platform.session() as db:
        bootstrap(db, "admin-password")
        db.commit()
    with TestClient(create_app(platform, run_loop=False)) as client:
        api = Api(client)
        admin = api.login("admin", "admin-password")
        users = {name: api.user(admin, name) for name in ("alice", "bob", "dave", "carol")}
        api.client.post("/api/v1/accounts", json={"name": "vision"}, headers=admin)
        for name in ("alice", "bob", "dave"):
            r = api.client.post("/api/v1/accounts/vision/members", json={"username": name}, headers=admin)
            assert r.status_code == 201
        r = api.client.put("/api/v1/spaces/account:vision/members/dave", json={"mode": "ro"}, headers=admin)
        assert r.status_code == 200, r.text
        yield api, admin, users, settings
    platform.engine.dispose()


def fresh(env, name: str) -> dict[str, str]:
    """A user of this test's own, so that its usage and quotas start from nothing."""
    api, admin, _, _ = env
    return api.user(admin, name)


def upload(api: Api, headers, space: str, path: str, data: bytes, chunk: int = CHUNK):
    r = api.client.post(f"/api/v1/spaces/{space}/uploads", json={"path": path, "size": len(data)}, headers=headers)
    if r.status_code != 201:
        return r
    uid, offset = r.json()["id"], 0
    while offset < len(data):
        part = data[offset : offset + chunk]
        r = api.client.patch(
            f"/api/v1/spaces/{space}/uploads/{uid}", content=part, headers={**headers, "Upload-Offset": str(offset)}
        )
        if r.status_code != 200:
            return r
        offset = r.json()["offset"]
    return r


def chunk(api: Api, headers, url: str, data: bytes, offset: int):
    headers = {**headers, "Upload-Offset": str(offset)}
    return api.client.patch(url, content=data[offset : offset + CHUNK], headers=headers)


def download(api: Api, headers, space: str, path: str):
    return api.client.get(f"/api/v1/spaces/{space}/files", params={"path": path}, headers=headers)


def names(api: Api, headers, space: str, path: str = "") -> list[str]:
    r = api.client.get(f"/api/v1/spaces/{space}/list", params={"path": path}, headers=headers)
    assert r.status_code == 200, r.text
    return [e["name"] for e in r.json()["entries"]]


# who may read (list, download) and write (mkdir, upload, move, delete) each space
RULES = {
    "personal:alice": {"alice": "rw", "bob": "", "dave": "", "carol": "", "admin": "r"},
    "account:vision": {"alice": "rw", "bob": "rw", "dave": "r", "carol": "", "admin": "rw"},
    "public": {"alice": "r", "bob": "r", "dave": "r", "carol": "r", "admin": "rw"},
}


@pytest.mark.parametrize("space", list(RULES))
def test_every_permission_rule(env, space):
    api, admin, users, _ = env
    users = {**users, "admin": admin}
    writer = next(h for who, h in users.items() if RULES[space][who] == "rw")
    assert upload(api, writer, space, "seed.txt", b"seed").status_code == 200
    for who, headers in users.items():
        rule = RULES[space][who]
        listing = api.client.get(f"/api/v1/spaces/{space}/list", headers=headers)
        got = download(api, headers, space, "seed.txt")
        made = api.client.post(f"/api/v1/spaces/{space}/folders", json={"path": f"by-{who}"}, headers=headers)
        put = upload(api, headers, space, f"{who}.txt", b"x")
        moved = api.client.post(
            f"/api/v1/spaces/{space}/move", json={"src": "seed.txt", "dst": f"seed-{who}.txt"}, headers=headers
        )
        if moved.status_code == 200:
            api.client.post(
                f"/api/v1/spaces/{space}/move", json={"src": f"seed-{who}.txt", "dst": "seed.txt"}, headers=headers
            )
        deleted = api.client.delete(f"/api/v1/spaces/{space}/files", params={"path": f"by-{who}"}, headers=headers)
        reads = (listing.status_code, got.status_code)
        writes = (made.status_code, put.status_code, moved.status_code, deleted.status_code)
        assert reads == ((200, 200) if "r" in rule else (403, 403)), (who, listing.text)
        assert writes == ((201, 200, 200, 200) if "w" in rule else (403,) * 4), (who, made.text, put.text)
        if "r" in rule:
            assert got.content == b"seed"


def test_spaces_list_shows_what_each_user_may_reach(env):
    api, admin, users, _ = env
    mine = {s["space"]: s["access"] for s in api.client.get("/api/v1/spaces", headers=users["carol"]).json()}
    assert mine == {"personal:carol": "write", "account:default": "write", "public": "read"}
    mine = {s["space"]: s["access"] for s in api.client.get("/api/v1/spaces", headers=users["dave"]).json()}
    assert mine == {"personal:dave": "write", "account:default": "write", "account:vision": "read", "public": "read"}


def test_only_admins_change_quotas_and_modes(env):
    api, admin, users, _ = env
    fresh(env, "quinn")
    for who in ("alice", "bob"):
        r = api.client.patch("/api/v1/spaces/personal", json={"quota_bytes": 1}, headers=users[who])
        assert r.status_code == 403
        r = api.client.put("/api/v1/spaces/account:vision/members/dave", json={"mode": "rw"}, headers=users[who])
        assert r.status_code == 403
    r = api.client.patch("/api/v1/spaces/personal:quinn", json={"quota_files": 7}, headers=admin)
    assert r.status_code == 200 and r.json()["quota_files"] == 7
    audit = api.client.get("/api/v1/audit", headers=admin)
    assert "set-space-quota" in audit.text


def test_a_resumable_upload_survives_an_interruption(env, tmp_path):
    api, _, users, settings = env
    alice = fresh(env, "rita")
    data = os.urandom(5 * CHUNK + 123)
    r = api.client.post("/api/v1/spaces/personal/uploads", json={"path": "big.bin", "size": len(data)}, headers=alice)
    uid = r.json()["id"]
    url = f"/api/v1/spaces/personal/uploads/{uid}"
    for offset in (0, CHUNK):
        r = chunk(api, alice, url, data, offset)
        assert r.status_code == 200 and not r.json()["done"]
    assert "big.bin" not in names(api, alice, "personal")  # nothing visible before the last byte
    # the client lost track: a chunk at the wrong offset is refused with where the platform is
    r = api.client.patch(url, content=data[:CHUNK], headers={**alice, "Upload-Offset": "0"})
    assert r.status_code == 409 and r.json()["detail"].startswith("the upload is at byte 131072")
    offset = api.client.get(url, headers=alice).json()["offset"]
    assert offset == 2 * CHUNK
    while offset < len(data):
        r = chunk(api, alice, url, data, offset)
        offset = r.json()["offset"]
    assert r.json()["done"]
    assert download(api, alice, "personal", "big.bin").content == data
    space = api.client.get("/api/v1/spaces/personal", headers=alice).json()
    assert space["used_bytes"] == len(data) and space["used_files"] == 1
    assert api.client.get(url, headers=alice).status_code == 404  # finished


def test_an_upload_belongs_to_its_starter(env):
    api, _, users, _ = env
    r = api.client.post("/api/v1/spaces/account:vision/uploads", json={"path": "x", "size": 3}, headers=users["bob"])
    url = f"/api/v1/spaces/account:vision/uploads/{r.json()['id']}"
    r = api.client.patch(url, content=b"abc", headers={**users["alice"], "Upload-Offset": "0"})
    assert r.status_code == 404


def test_a_chunk_over_the_limit_or_past_the_declared_size(env):
    api, _, users, settings = env
    alice = users["alice"]
    r = api.client.post("/api/v1/spaces/personal/uploads", json={"path": "f", "size": 10}, headers=alice)
    url = f"/api/v1/spaces/personal/uploads/{r.json()['id']}"
    r = api.client.patch(url, content=b"x" * (CHUNK + 1), headers={**alice, "Upload-Offset": "0"})
    assert r.status_code == 413
    r = api.client.patch(url, content=b"x" * 11, headers={**alice, "Upload-Offset": "0"})
    assert r.status_code == 400 and "declared size" in r.text
    r = api.client.patch(url, content=b"x", headers={**alice, "Upload-Offset": "zero"})
    assert r.status_code == 400
    r = api.client.post("/api/v1/spaces/personal/uploads", json={"path": "g", "size": 2**41}, headers=alice)
    assert r.status_code == 400 and "at most" in r.text


def test_a_quota_overrun_leaves_nothing_behind(env):
    api, admin, users, settings = env
    alice = fresh(env, "quentin")
    r = api.client.post("/api/v1/spaces/personal/uploads", json={"path": "huge", "size": 11 * 2**20}, headers=alice)
    assert r.status_code == 409 and "quota" in r.json()["detail"]
    r = api.client.post("/api/v1/spaces/personal/uploads", json={"path": "a.bin", "size": 3 * CHUNK}, headers=alice)
    url = f"/api/v1/spaces/personal/uploads/{r.json()['id']}"
    r = api.client.patch(url, content=b"x" * CHUNK, headers={**alice, "Upload-Offset": "0"})
    assert r.status_code == 200
    api.client.patch("/api/v1/spaces/personal:quentin", json={"quota_bytes": 2 * CHUNK}, headers=admin)
    r = api.client.patch(url, content=b"x" * CHUNK, headers={**alice, "Upload-Offset": str(CHUNK)})
    assert r.status_code == 409
    assert names(api, alice, "personal") == []
    assert os.listdir(settings.workspaces / UPLOADS_DIR / "quentin") == []  # the part is gone too
    assert api.client.get(url, headers=alice).status_code == 404
    # the file-count quota as well
    api.client.patch("/api/v1/spaces/personal:quentin", json={"quota_bytes": None, "quota_files": 1}, headers=admin)
    assert api.client.post("/api/v1/spaces/personal/folders", json={"path": "d"}, headers=alice).status_code == 201
    r = api.client.post("/api/v1/spaces/personal/folders", json={"path": "e"}, headers=alice)
    assert r.status_code == 409 and names(api, alice, "personal") == ["d"]
    assert upload(api, alice, "personal", "f", b"1").status_code == 409


def test_name_clashes_are_errors_not_overwrites(env):
    api, _, users, _ = env
    alice = fresh(env, "nina")
    assert upload(api, alice, "personal", "a.txt", b"first").status_code == 200
    assert upload(api, alice, "personal", "b.txt", b"second").status_code == 200
    assert upload(api, alice, "personal", "a.txt", b"again").status_code == 409
    r = api.client.post("/api/v1/spaces/personal/move", json={"src": "b.txt", "dst": "a.txt"}, headers=alice)
    assert r.status_code == 409
    api.client.post("/api/v1/spaces/personal/folders", json={"path": "d"}, headers=alice)
    assert api.client.post("/api/v1/spaces/personal/folders", json={"path": "d"}, headers=alice).status_code == 409
    assert download(api, alice, "personal", "a.txt").content == b"first"


@pytest.mark.parametrize("path", ["../bob/x", "/etc/passwd", "a/../../x", "a\nb", "a\0b", "", ".", "x" * 5000])
def test_bad_paths_are_refused_cleanly(env, path):
    api, _, users, _ = env
    alice = users["alice"]
    for r in (
        download(api, alice, "personal", path),
        api.client.post("/api/v1/spaces/personal/folders", json={"path": path}, headers=alice),
        api.client.post("/api/v1/spaces/personal/uploads", json={"path": path, "size": 1}, headers=alice),
        api.client.delete("/api/v1/spaces/personal/files", params={"path": path}, headers=alice),
        api.client.post("/api/v1/spaces/personal/move", json={"src": "x", "dst": path}, headers=alice),
    ):
        assert r.status_code in (400, 404), (path, r.status_code, r.text)  # 404: a move's missing source
    assert not (Path("/etc") / "x").exists()


@pytest.mark.parametrize("name", ["with space.txt", "ünïcødé 文件.txt", "quote\"'.txt", "semi;colon", "%2e%2e"])
def test_odd_names_work(env, name):
    api, _, users, _ = env
    alice = users["alice"]
    assert upload(api, alice, "personal", name, b"odd").status_code == 200
    assert name in names(api, alice, "personal")
    r = download(api, alice, "personal", name)
    assert r.content == b"odd" and "attachment" in r.headers["content-disposition"]


def test_bad_space_names(env):
    api, _, users, _ = env
    for space in ("nope", "account:ghost", "personal:ghost", "public:x", "account:..", "personal:a%2Fb"):
        r = api.client.get(f"/api/v1/spaces/{space}/list", headers=users["alice"])
        assert r.status_code in (400, 404), (space, r.text)


def test_links_a_job_planted_are_never_followed(env):
    """Alice's job (her uid: it owns her workspace) links to /etc, to Bob's space and to the account's space's
    host path; the server lists them as links and serves none of them, and deleting one deletes only the link."""
    api, admin, users, settings = env
    alice, bob = fresh(env, "lena"), users["bob"]
    assert upload(api, bob, "personal", "private.txt", b"bob's").status_code == 200
    assert upload(api, alice, "personal", "mine.txt", b"mine").status_code == 200
    home = settings.workspaces / "lena"
    os.symlink("/etc/passwd", home / "passwd")
    os.symlink("/etc", home / "etc")
    os.symlink(settings.workspaces / "bob", home / "bob")
    os.symlink(settings.spaces_dir, home / "spaces")
    os.mkfifo(home / "fifo")
    os.link(settings.workspaces / "bob" / "private.txt", home / "hard.txt")
    for who in (alice, admin):
        for path in ("passwd", "etc/passwd", "bob/private.txt", "spaces/account/vision/data", "fifo"):
            assert download(api, who, "personal:lena", path).status_code == 400, path
        for path in ("etc", "bob", "spaces"):
            r = api.client.get("/api/v1/spaces/personal:lena/list", params={"path": path}, headers=who)
            assert r.status_code == 400
    r = api.client.get("/api/v1/spaces/personal/list", headers=alice)
    kinds = {e["name"]: e["kind"] for e in r.json()["entries"]}
    assert kinds == {"passwd": "link", "etc": "link", "bob": "link", "spaces": "link", "fifo": "other",
                     "hard.txt": "file", "mine.txt": "file"}  # fmt: skip
    if os.geteuid() == 0:  # the hard link to Bob's file: owned by Bob's uid, not Alice's
        assert download(api, alice, "personal", "hard.txt").status_code == 400
    r = api.client.post("/api/v1/spaces/personal/folders", json={"path": "bob/x"}, headers=alice)
    assert r.status_code == 400
    assert upload(api, alice, "personal", "etc/x", b"x").status_code in (400, 404)
    assert api.client.delete("/api/v1/spaces/personal/files", params={"path": "bob"}, headers=alice).status_code == 200
    assert download(api, bob, "personal", "private.txt").content == b"bob's"


def test_usage_is_counted_incrementally_and_reconciled(env):
    api, admin, users, settings = env
    alice = fresh(env, "ursula")
    upload(api, alice, "personal", "a", b"12345")
    api.client.post("/api/v1/spaces/personal/folders", json={"path": "d/e", "parents": True}, headers=alice)
    upload(api, alice, "personal", "d/e/b", b"123")
    space = api.client.get("/api/v1/spaces/personal", headers=alice).json()
    assert (space["used_bytes"], space["used_files"]) == (8, 3)  # a, d/e (one counted), d/e/b
    r = api.client.delete("/api/v1/spaces/personal/files", params={"path": "d"}, headers=alice)
    assert r.json() == {"space": "personal:ursula", "freed_bytes": 3, "freed_files": 3}
    (settings.workspaces / "ursula" / "written-by-a-job").write_bytes(b"x" * 100)  # not through the platform
    space = api.client.get("/api/v1/spaces/personal", headers=alice).json()
    assert (space["used_bytes"], space["used_files"]) == (5, 0)
    assert api.client.post("/api/v1/spaces/personal:ursula/reconcile", headers=alice).status_code == 403
    space = api.client.post("/api/v1/spaces/personal:ursula/reconcile", headers=admin).json()
    assert (space["used_bytes"], space["used_files"]) == (105, 2) and space["reconciled_at"]


def test_listing_pages(env):
    api, _, users, settings = env
    alice = fresh(env, "paul")
    api.client.get("/api/v1/spaces/personal", headers=alice)  # makes the space
    for i in range(25):
        (settings.workspaces / "paul" / f"f{i:02d}").touch()
    seen, after = [], ""
    while after is not None:
        r = api.client.get("/api/v1/spaces/personal/list", params={"after": after, "limit": 10}, headers=alice)
        seen += [e["name"] for e in r.json()["entries"]]
        after = r.json()["next"]
    assert seen == [f"f{i:02d}" for i in range(25)]
    assert api.client.get("/api/v1/spaces/personal/list", params={"limit": 0}, headers=alice).status_code == 400


def test_the_background_reconciliation(env):
    """What the server's thread runs: stale counters set from a walk, and uploads left for a day dropped."""
    api, _, _, settings = env
    olga = fresh(env, "olga")
    r = api.client.post("/api/v1/spaces/personal/uploads", json={"path": "left.bin", "size": 10}, headers=olga)
    upload_id = r.json()["id"]
    (settings.workspaces / "olga" / "by-a-job.txt").write_bytes(b"12345")
    spaces = api.client.app.state.spaces
    with api.client.app.state.platform.session() as db:
        assert spaces.reconcile_due(db, time.time()) >= 1
        assert spaces.reconcile_due(db, time.time()) == 0  # fresh counters are not walked again
        spaces.reconcile_due(db, time.time() + 2 * 86400)
    space = api.client.get("/api/v1/spaces/personal", headers=olga).json()
    assert (space["used_bytes"], space["used_files"]) == (5, 1)
    assert api.client.get(f"/api/v1/spaces/personal/uploads/{upload_id}", headers=olga).status_code == 404
    assert os.listdir(settings.workspaces / UPLOADS_DIR / "olga") == []
