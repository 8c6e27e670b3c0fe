"""The portal's file browser (issue 27) in a real browser (Debian's chromium) against a real server: a space's
folder with its usage, a new folder, a file uploaded in several chunks through the API's resumable uploads,
downloaded back byte for byte, deleted; a text file previewed as escaped text and an image as an image that
runs nothing; another user finds neither the space nor the file (404), and does not
see the space among theirs. The page's accessibility is checked with every other page's (test_portal_design)."""

import html
import os
import re
from pathlib import Path

import httpx
import pytest

from caldera.server.web.render import STATIC
from tests.conftest import ServerProcess, free_port, server_env, traversable
from tests.portal import browser_for, post_form
from tests.test_browser import browser  # noqa: F401 - the chromium fixture
from tests.test_portal_browser import _login
from tests.test_server_process import token

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
CHUNK = 4096


@pytest.fixture
def small_chunks(tmp_path, db_url):
    """A server whose uploads come in 4 KiB chunks: a small file takes several."""
    env = {**server_env(tmp_path, db_url), "CALDERA_STORAGE_CHUNK_BYTES": str(CHUNK)}
    srv = ServerProcess(traversable(tmp_path) / "data", free_port(), env)
    srv.start()
    yield srv
    srv.stop()


def test_upload_browse_download_and_delete_in_my_space_and_another_user_gets_404(small_chunks, browser, tmp_path):  # noqa: F811
    server = small_chunks
    admin = token(server)
    for name in ("ana", "bob"):
        r = httpx.post(server.url + "/api/v1/users", json={"username": name, "password": "password-123"},
                       headers=admin, timeout=30)  # fmt: skip
        assert r.status_code == 201, r.text
    assert (STATIC / "file_upload.js").exists()
    page = browser.new_context(accept_downloads=True).new_page()
    _login(page, server, "ana", "password-123")
    page.wait_for_url(server.url + "/")
    page.click("nav a[href='/files']")
    page.click("#spaces [data-space='personal:ana'] a")
    page.wait_for_url("**/files/personal:ana")
    assert "This folder is empty." in page.inner_text("#entries")
    page.fill("#folder-name", "data set")
    page.click("#new-folder button[type=submit]")
    page.click("#entries a.folder:has-text('data set')")
    page.wait_for_selector("#crumbs [aria-current=page]:has-text('data set')")
    payload = os.urandom(3 * CHUNK + 123)  # four chunks
    source = tmp_path / "weights 数据.bin"
    source.write_bytes(payload)
    page.set_input_files("#upload-files", str(source))
    page.click("#upload-start")
    page.wait_for_selector("#entries a.preview:has-text('weights 数据.bin')")
    link = page.locator(f"#entries tr[data-entry='{source.name}'] a.download")
    with page.expect_download() as got:
        link.click()
    assert Path(got.value.path()).read_bytes() == payload
    href = link.get_attribute("href")
    assert "12.1 KiB of" in page.inner_text("#space-usage")  # the space counts the upload
    # bob: not among his spaces, and neither the folder nor the file exists for him
    other = browser.new_context().new_page()
    _login(other, server, "bob", "password-123")
    other.wait_for_url(server.url + "/")
    other.goto(server.url + "/files")
    assert not other.query_selector("[data-space='personal:ana']") and other.query_selector(
        "[data-space='personal:bob']"
    )
    for path in ("/files/personal:ana", "/files/personal:ana?path=data+set", href):
        assert other.goto(server.url + path).status == 404, path
    other.context.close()
    # deleted: gone from the folder and from the API
    page.click(f"#entries tr[data-entry='{source.name}'] form.delete button")
    page.wait_for_selector("#entries:has-text('This folder is empty.')")
    r = httpx.get(server.url + "/api/v1/spaces/personal:ana/list", params={"path": "data set"},
                  headers=token(server, "ana", "password-123"))  # fmt: skip
    assert r.status_code == 200 and r.json()["entries"] == []
    page.context.close()


def test_a_large_folder_is_listed_a_page_at_a_time(api, admin):
    """Through the app: 55 files make a page of 50 with a link to the next, which has the other 5 (the API's
    cursor); a path that leaves the space is refused."""
    ana = api.user(admin, "ana")
    for i in range(55):
        r = api.client.post("/api/v1/spaces/personal/uploads", json={"path": f"f{i:02}.txt", "size": 0}, headers=ana)
        assert r.status_code == 201, r.text
    page = browser_for(api.client, "ana", "password-123")
    first = page.get("/files/personal:ana").text
    assert first.count("data-entry=") == 50 and 'data-entry="f49.txt"' in first and "f50.txt" not in first
    following = html.unescape(re.search(r'rel="next" href="([^"]+)"', first)[1])
    second = page.get(following).text
    assert second.count("data-entry=") == 5 and 'data-entry="f54.txt"' in second and 'rel="next"' not in second
    assert page.get("/files/personal:ana", params={"path": "../bob"}).status_code == 400  # refused, not followed


def _put(api, headers, path: str, data: bytes) -> None:
    r = api.client.post("/api/v1/spaces/personal/uploads", json={"path": path, "size": len(data)}, headers=headers)
    assert r.status_code == 201, r.text
    r = api.client.patch(f"/api/v1/spaces/personal/uploads/{r.json()['id']}", content=data,
                         headers={**headers, "Upload-Offset": "0"})  # fmt: skip
    assert r.json()["done"], r.text


def test_a_text_file_previews_as_text_an_image_as_an_image_and_others_only_download(api, admin):
    ana = api.user(admin, "ana")
    api.user(admin, "bob")
    _put(api, ana, "notes.md", "# 笔记\n<script>alert(1)</script>\n".encode())
    png = bytes.fromhex("89504e470d0a1a0a") + b"<html><script>alert(1)</script>"  # an image's name, anything inside
    _put(api, ana, "plot.png", png)
    _put(api, ana, "weights.bin", bytes(range(256)))
    page = browser_for(api.client, "ana", "password-123")
    text = page.get("/files/personal:ana/preview", params={"path": "notes.md"}).text
    assert "# 笔记" in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text and "<script>alert" not in text
    assert 'id="preview-image"' in page.get("/files/personal:ana/preview", params={"path": "plot.png"}).text
    r = page.get("/files/personal:ana/image", params={"path": "plot.png"})
    assert r.content == png and r.headers["content-type"] == "image/png"
    assert r.headers["x-content-type-options"] == "nosniff" and "sandbox" in r.headers["content-security-policy"]
    assert page.get("/files/personal:ana/image", params={"path": "notes.md"}).status_code == 404  # not an image type
    assert 'id="no-preview"' in page.get("/files/personal:ana/preview", params={"path": "weights.bin"}).text
    bob = browser_for(api.client, "bob", "password-123")
    for route in ("preview", "image"):
        assert bob.get(f"/files/personal:ana/{route}", params={"path": "plot.png"}).status_code == 404, route


def test_move_and_rename_through_the_folder_page_keep_the_apis_rules(api, admin):
    """The folder page's move form renames in place and moves into another folder (the file's bytes with it); a
    name that is taken is refused on the page (never replaced), a path out of the space is refused, and another
    user's space is a page that does not exist."""
    ana = api.user(admin, "ana")
    api.user(admin, "bob")
    _put(api, ana, "draft.txt", b"v1")
    _put(api, ana, "taken.txt", b"keep me")
    api.client.post("/api/v1/spaces/personal/folders", json={"path": "done"}, headers=ana)
    page = browser_for(api.client, "ana", "password-123")
    listing = page.get("/files/personal:ana").text
    assert 'action="/files/personal:ana/move"' in listing and "Move or rename draft.txt" in listing
    assert "移动或重命名 draft.txt" in page.get("/files/personal:ana", headers={"Accept-Language": "zh"}).text

    r = post_form(page, "/files/personal:ana/move", {"path": "draft.txt", "to": "final.txt"})
    assert r.status_code == 303 and r.headers["location"] == "/files/personal:ana", r.text
    r = post_form(page, "/files/personal:ana/move", {"path": "final.txt", "to": "done/final.txt"})
    assert r.status_code == 303, r.text
    names = lambda path: [e["name"] for e in api.client.get(  # noqa: E731
        "/api/v1/spaces/personal/list", params={"path": path}, headers=ana).json()["entries"]]  # fmt: skip
    assert names("done") == ["final.txt"] and "draft.txt" not in names("") and "final.txt" not in names("")
    got = api.client.get("/api/v1/spaces/personal/files", params={"path": "done/final.txt"}, headers=ana)
    assert got.content == b"v1"

    r = post_form(page, "/files/personal:ana/move", {"path": "done/final.txt", "to": "taken.txt"})
    assert r.status_code == 400 and '<ul class="err" role="alert">' in r.text, r.text
    got = api.client.get("/api/v1/spaces/personal/files", params={"path": "taken.txt"}, headers=ana)
    assert got.content == b"keep me"  # not replaced
    r = post_form(page, "/files/personal:ana/move", {"path": "taken.txt", "to": "../bob/taken.txt"})
    assert r.status_code == 400 and '<ul class="err" role="alert">' in r.text and "taken.txt" in names("")
    bob = browser_for(api.client, "bob", "password-123")
    assert post_form(bob, "/files/personal:ana/move", {"path": "taken.txt", "to": "x.txt"}).status_code == 404
    assert "taken.txt" in names("")
