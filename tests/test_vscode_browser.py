"""VS Code in the browser (a vscode job, code-server) in a real browser (Debian's chromium, driven by Playwright),
against a real `caldera up` as root on the process runtime: `caldera vscode` starts it; from the job's page the
editor opens on the lab's own origin, at its root, through the one-use ticket; a file of the workspace is opened,
edited and saved, and a terminal runs a command, both over code-server's websockets through the proxy, as the job's
uid. Another user gets 404 everywhere; a foreign Origin is refused with the owner's own lab cookie."""

from __future__ import annotations

import socket
from urllib.parse import urlsplit

import httpx
import pytest

from tests import needs
from tests.conftest import lab_client, wait_for
from tests.needs import root_user  # noqa: F401 - fixture
from tests.test_browser import browser  # noqa: F401 - fixture
from tests.test_exec_api import _caldera, _login, _user, runtime_name, server  # noqa: F401 - fixtures
from tests.test_exec_browser import _log_in

pytestmark = [pytest.mark.usefixtures("root_user"), pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)]


def _in_job(server, config, jid: str, command: str) -> str:  # noqa: F811
    r = _caldera(server, "exec", jid, "--", "sh", "-c", command, config=config)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _websocket(server, jid: str, cookie: str, origin: str):  # noqa: F811
    """A websocket handshake at the job's lab host (``*.localhost`` on loopback, as browsers resolve it)."""
    from websockets.sync.client import connect

    sock = socket.create_connection(("127.0.0.1", server.lab_port), timeout=30)
    url = (
        f"ws://{urlsplit(server.lab_url(jid)).netloc}/?reconnectionToken=t&reconnection=false&skipWebSocketFrames=false"
    )
    return connect(url, sock=sock, origin=origin, additional_headers={"Cookie": f"caldera_lab={cookie}"})


def test_vscode_in_the_browser(server, browser, tmp_path) -> None:  # noqa: F811
    needs.code_server()
    _user(server, "alice")
    bob = _user(server, "bob")
    config = _login(server, tmp_path, "alice")
    r = _caldera(server, "vscode", "--cpu", "1", "--memory-mib", "2048", "--timeout", "180", config=config)
    assert r.returncode == 0 and "/lab/" in r.stdout, (r.stdout, r.stderr)
    jid = r.stdout.split("/jobs/")[1].split("/")[0]
    _in_job(server, config, jid, "printf 'first line\\n' > notes.txt")

    page = _log_in(browser, server, "alice")
    page.goto(f"{server.url}/jobs/{jid}")
    with page.context.expect_page() as opened:
        page.click("#open-lab")  # a new tab, on the lab's origin
    ide = opened.value
    ide.wait_for_selector(".monaco-workbench .explorer-folders-view", timeout=120_000)
    assert ide.url.startswith(server.lab_url(jid) + "/?folder=")  # at the root of its own origin, no prefix
    # the explorer lists the workspace: code-server's remote file system answered over its websocket
    ide.wait_for_selector(".explorer-folders-view .monaco-list-row[aria-label*='notes.txt']", timeout=60_000)
    ide.screenshot(path=str(tmp_path / "vscode.png"))

    # open the file, type into it, save it: the job's file changes
    ide.click(".explorer-folders-view .monaco-list-row[aria-label*='notes.txt']")
    editor = ide.locator(".editor-instance .monaco-editor .view-lines")
    editor.wait_for(timeout=30_000)
    editor.click()
    ide.keyboard.press("Control+End")
    ide.keyboard.type("typed in the browser")
    ide.keyboard.press("Control+s")
    wait_for(lambda: "typed in the browser" in _in_job(server, config, jid, "cat notes.txt"), 60, what="the saved file")

    # a terminal: node-pty in the job, its websocket through the proxy; what it runs runs as the job's uid
    ide.keyboard.press("Control+Backquote")
    ide.wait_for_selector(".terminal-wrapper .xterm", timeout=60_000)
    ide.locator(".terminal-wrapper .xterm").click()
    ide.keyboard.type("echo $((6*7)) $(id -u) > from-terminal.txt\n")
    uid = _in_job(server, config, jid, "id -u").strip()
    wait_for(
        lambda: _in_job(server, config, jid, "cat from-terminal.txt 2>/dev/null").split() == ["42", uid],
        60,
        what="the terminal's command",
    )
    ide.screenshot(path=str(tmp_path / "vscode-terminal.png"))

    # zh: the job page's way in
    zh = _log_in(browser, server, "alice", lang="zh-CN")
    zh.goto(f"{server.url}/jobs/{jid}")
    assert zh.locator("#open-lab").inner_text().strip() == "打开 VS Code"
    zh.screenshot(path=str(tmp_path / "vscode-job-zh.png"))

    # another user: no way in from the platform's origin, none at the lab's with his token
    other = _log_in(browser, server, "bob")
    assert other.goto(f"{server.url}/jobs/{jid}/lab/").status == 404
    with lab_client(headers=bob) as client:
        assert client.get(server.lab_url(jid) + "/").status_code == 404

    # a foreign Origin, with alice's own lab cookie: the websocket is refused, a state-changing request too
    [cookie] = [c["value"] for c in ide.context.cookies() if c["name"] == "caldera_lab"]
    from websockets.exceptions import InvalidStatus

    with pytest.raises(InvalidStatus) as refused:
        _websocket(server, jid, cookie, "http://evil.example")
    assert refused.value.response.status_code == 403
    _websocket(server, jid, cookie, server.lab_url(jid)).close()  # the control: its own origin passes
    with lab_client() as client:
        r = client.post(
            server.lab_url(jid) + "/logout",
            headers={"Cookie": f"caldera_lab={cookie}", "Origin": "http://evil.example"},
        )
        assert r.status_code == 403 and r.json()["code"] == "CrossOrigin"
    assert httpx.post(f"{server.url}/api/v1/jobs/{jid}/cancel", headers=bob).status_code == 404  # not his
    r = _caldera(server, "cancel", jid, config=config)
    assert r.returncode == 0, r.stderr
