"""The job page's terminal in a real browser (Debian's chromium, driven by Playwright), against a real `caldera up`
as root: a command's output shows, the terminal follows the box's size, Ctrl-C interrupts, the shell is the job's
uid; another user has neither the page nor a terminal; the session ends when the job does."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.conftest import wait_for
from tests.needs import root_user  # noqa: F401 - fixture
from tests.test_browser import browser  # noqa: F401 - fixture
from tests.test_exec_api import _os_uid, _sleeper, _user, runtime_name, server  # noqa: F401 - fixtures
from tests.test_server_process import until

pytestmark = [pytest.mark.usefixtures("root_user"), pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)]


def _log_in(browser, server, name: str, lang: str = "en"):  # noqa: F811
    context = browser.new_context(locale=lang, viewport={"width": 1200, "height": 900})
    page = context.new_page()
    page.goto(server.url + "/login")
    page.fill("input[name=username]", name)
    page.fill("input[name=password]", "password-123")
    page.click("button[type=submit]")
    page.wait_for_load_state()
    return page


def _screen(page) -> str:
    return page.locator("#terminal .xterm-rows").inner_text()


def _shows(page, pattern: str, timeout: float = 30) -> None:
    """Polled from here: the page's CSP forbids the eval that Playwright's wait_for_function needs."""
    wait_for(lambda: re.search(pattern, _screen(page)), timeout, what=f"{pattern!r} in the terminal")


def _status(page, *words: str, timeout: float = 30) -> None:
    status = page.locator("#terminal-status")
    wait_for(lambda: any(w in status.inner_text() for w in words), timeout, what=f"{words} in the status")


def test_the_job_page_terminal(server, browser, tmp_path) -> None:  # noqa: F811
    alice = _user(server, "alice")
    _user(server, "bob")
    jid = _sleeper(server, alice)
    page = _log_in(browser, server, "alice")
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(f"{server.url}/jobs/{jid}")
    page.click("#terminal-open")
    page.wait_for_selector("#terminal .xterm-rows")
    _status(page, "rank 0")
    page.locator("#terminal").click()
    page.keyboard.type("echo $((6*7)); id -u; stty size\n")
    uid = _os_uid(server, "alice")
    _shows(page, rf"\n42\s*\n{uid}\s*\n\d+ \d+")
    rows, cols = map(int, re.search(r"\n42\s*\n\d+\s*\n(\d+) (\d+)", _screen(page)).groups())
    assert rows > 5 and cols > 40
    # a narrower window: the box shrinks, xterm fits to it, and the shell hears of the new size
    page.set_viewport_size({"width": 700, "height": 900})
    page.wait_for_timeout(500)
    page.keyboard.type("clear; stty size\n")
    _shows(page, r"^\s*\d+ \d+")
    assert int(_screen(page).split()[1]) < cols
    # Ctrl-C reaches the foreground command, not the session
    page.keyboard.type("sleep 300; echo not-interrupted\n")
    page.wait_for_timeout(500)
    page.keyboard.press("Control+C")
    page.keyboard.type("echo after-$((1+1))\n")
    _shows(page, r"after-2")
    assert not re.search(r"^not-interrupted", _screen(page), re.M)  # only the typed line shows it
    page.screenshot(path=str(tmp_path / "terminal-en.png"))
    assert not errors, errors  # CSP kept every script and style the terminal needs

    # bob: the page of alice's job does not exist for him, and neither does its terminal
    other = _log_in(browser, server, "bob")
    response = other.goto(f"{server.url}/jobs/{jid}")
    assert response.status == 404 and other.locator("#terminal-open").count() == 0

    # the session ends with the job
    assert httpx.post(f"{server.url}/api/v1/jobs/{jid}/cancel", headers=alice).status_code == 200
    _status(page, "the job ended", "exited", "closed", timeout=60)
    until(server, alice, jid, {"Cancelled"})


def test_the_terminal_speaks_chinese(server, browser, tmp_path) -> None:  # noqa: F811
    alice = _user(server, "alice")
    jid = _sleeper(server, alice)
    page = _log_in(browser, server, "alice", lang="zh-CN")
    page.context.add_cookies([{"name": "caldera_lang", "value": "zh", "url": server.url}])
    page.goto(f"{server.url}/jobs/{jid}")
    page.click("#terminal-open")
    _status(page, "0")
    page.locator("#terminal").click()
    page.keyboard.type("echo 你好\n")
    _shows(page, r"\n你好")
    assert page.locator("#terminal-open").inner_text() == "打开终端"
    page.screenshot(path=str(tmp_path / "terminal-zh.png"))
