"""Publishing copies in the server's background: the request checks everything and answers at once with the version
``copying``; its progress shows in the API and on the catalogue's page; nothing mounts it, and nobody but its
publisher sees it, until it is ready. A server stopped mid-copy leaves it copying, nothing of it visible; the next
start copies it again, or fails it with the reason when its folder is gone (its version free again). The copies are
paced (``catalogue_copy_bytes_per_s``) so that they take seconds here: a real copy, not a stand-in."""

from __future__ import annotations

from caldera.db.models import CatalogueEntry
from caldera.server import catalogue_copies, files
from tests.conftest import api_on, make_settings, wait_for
from tests.fake_runtime import FakeRuntime
from tests.portal import browser_for
from tests.test_catalogue import _ended, _job, _publish, _upload
from tests.test_files_space_jobs import lab
from tests.test_runs import _until

BLOCK = bytes(range(256)) * 1024  # 256 KiB
PACE = 2**18  # bytes per second: 8 blocks take 8 s to copy


def _folder(api, h, path: str, blocks: int = 8) -> None:
    api.client.post("/api/v1/spaces/personal/folders", json={"path": path}, headers=h)
    for i in range(blocks):
        _upload(api, h, "personal", f"{path}/part-{i}.bin", BLOCK)


def _entry(api, h, ref: str):
    return api.client.get(f"/api/v1/catalogue/dataset/{ref}", headers=h)


def test_a_publish_answers_at_once_and_its_version_is_mounted_once_ready(tmp_path):
    settings = make_settings(tmp_path, catalogue_copy_bytes_per_s=PACE)
    with api_on(settings, FakeRuntime(settings)) as (api, admin):
        u = lab(api, admin, {"vision": ("alice", "dave"), "other": ("bob",)})
        alice = u["alice"]
        _folder(api, alice, "big")
        page = browser_for(api.client, "alice", "password-123")
        r = _publish(api, alice, name="big-set", version="v1", space="personal", path="big", visibility="public")
        assert r.status_code == 202 and r.json()["state"] == "copying", r.text

        # while it is copied: refused for mounts with why, not deleted, seen by its publisher only, with progress
        for ref in ("big-set@v1", "big-set"):
            refused = _job(api, alice, [{"dataset": ref, "at": "/data/big"}], "vision")
            assert refused.status_code == 400 and "big-set@v1 is still being copied" in refused.text, refused.text
        assert api.client.delete("/api/v1/catalogue/dataset/big-set/v1", headers=alice).status_code == 409
        assert _entry(api, u["bob"], "big-set@v1").status_code == 404
        assert api.client.get("/api/v1/catalogue", params={"q": "big-set"}, headers=u["bob"]).json() == []
        going = wait_for(lambda: (e := _entry(api, alice, "big-set@v1").json())["size_bytes"] and e, 10,
                         interval=0.05, what="progress")  # fmt: skip
        assert going["state"] == "copying" and 0 < going["size_bytes"] < 8 * len(BLOCK), going
        html = page.get("/data", params={"q": "big-set"}).text
        assert 'data-entry="big-set@v1" data-state="copying"' in html and 'hx-trigger="every 2s"' in html, html
        assert "files so far" in html and "{dataset: big-set@v1" not in html  # no mount line yet

        # a user has at most 4 versions copying at once: each is a thread of the server
        more = [_publish(api, alice, name="big-set", version=f"v{i}", space="personal", path="big") for i in (2, 3, 4)]
        fifth = _publish(api, alice, name="big-set", version="v5", space="personal", path="big")
        assert fifth.status_code == 409 and "you have 4 versions being copied" in fifth.text, fifth.text
        assert [_ended(api, alice, m)["state"] for m in more] == ["ready"] * 3

        ready = _ended(api, alice, r)
        assert (ready["state"], ready["size_bytes"], ready["files"]) == ("ready", 8 * len(BLOCK), 8), ready
        assert _entry(api, u["bob"], "big-set").json()["state"] == "ready"
        mounted = _job(api, u["bob"], [{"dataset": "big-set", "at": "/data/big"}], "other")
        assert mounted.status_code == 201, mounted.text
        _until(api, u["bob"], mounted.json()["id"], {"Running"})
        html = browser_for(api.client, "bob", "password-123").get("/data", params={"q": "big-set"}).text
        assert 'data-state="ready"' in html and "{dataset: big-set@v1" in html and "hx-select" not in html


def test_a_restart_copies_again_what_a_stopped_server_left_copying(tmp_path):
    """Two versions copying as the server stops: at the next start, one is copied again and ready; the other's
    folder was deleted meanwhile, so it fails with why (in Chinese too), and its version is free again."""
    settings = make_settings(tmp_path, catalogue_copy_bytes_per_s=PACE)
    with api_on(settings, FakeRuntime(settings)) as (api, admin):
        alice = lab(api, admin, {"vision": ("alice", "dave")})["alice"]
        _folder(api, alice, "kept")
        _folder(api, alice, "dropped")
        for name, path in (("kept-set", "kept"), ("dropped-set", "dropped")):
            r = _publish(api, alice, name=name, version="v1", space="personal", path=path)
            assert r.status_code == 202, r.text
    catalogue = files.catalogue_for(settings)
    with api_on(settings, FakeRuntime(settings)) as (api, _):
        alice = api.login("alice", "password-123")
        for name in ("kept-set", "dropped-set"):
            left = _entry(api, alice, f"{name}@v1").json()
            assert left["state"] == "copying" and left["size_bytes"] < 8 * len(BLOCK), left
        platform = api.client.app.state.platform
        with platform.session() as db:
            assert not any(catalogue.host_path(e).exists() for e in db.query(CatalogueEntry))  # nothing half-visible
        r = api.client.delete("/api/v1/spaces/personal/files", params={"path": "dropped"}, headers=alice)
        assert r.status_code == 200, r.text
        catalogue_copies.recover(platform)  # what the server's start does

        kept = wait_for(lambda: (e := _entry(api, alice, "kept-set@v1").json())["state"] != "copying" and e, 30)
        assert (kept["state"], kept["size_bytes"], kept["files"]) == ("ready", 8 * len(BLOCK), 8), kept
        dropped = wait_for(lambda: (e := _entry(api, alice, "dropped-set@v1").json())["state"] != "copying" and e, 30)
        assert dropped["state"] == "failed" and dropped["error"] == {
            "reason": "the folder personal:alice/dropped is gone",
            "code": "PublishSourceGone",
            "params": {"source": "personal:alice/dropped"},
        }, dropped
        html = browser_for(api.client, "alice", "password-123").get("/data", headers={"Accept-Language": "zh-CN"}).text
        assert "文件夹 personal:alice/dropped 已不存在" in html
        _folder(api, alice, "again", blocks=1)  # the failed version is free again
        again = _publish(api, alice, name="dropped-set", version="v1", space="personal", path="again")
        assert _ended(api, alice, again)["state"] == "ready"
