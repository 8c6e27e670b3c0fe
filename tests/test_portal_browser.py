"""The portal in a real browser (Debian's chromium through Playwright): a student logs in, gets a form error, submits
a batch job, follows its log live until it succeeds, cannot open someone else's job, switches to Chinese; an admin
changes a quota. Screenshots of the main pages go to test-output/portal/ (git-ignored). No page may trip the
Content-Security-Policy."""

from pathlib import Path

import httpx
import pytest

from caldera.server.web.render import STATIC
from tests.test_browser import browser  # noqa: F401 - the chromium fixture
from tests.test_server_process import token

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
SHOTS = Path(__file__).resolve().parents[1] / "test-output" / "portal"


def _login(page, server, username, password):
    page.goto(server.url + "/")
    assert "/login" in page.url
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")


def signed_in_page(chromium, server, username, password):
    """A page of a new browser context, logged in as ``username``, and the list its CSP violations go to."""
    page = chromium.new_context(locale="en-US").new_page()
    violations: list[str] = []
    page.on("console", lambda m: "Content Security Policy" in m.text and violations.append(m.text))
    _login(page, server, username, password)
    page.wait_for_selector(f"text=Jobs of {username}")
    return page, violations


def _shot(page, name):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def test_student_and_admin_in_the_browser(server, browser):  # noqa: F811
    assert (STATIC / "vendor" / "htmx.min.js").exists(), "no HTMX: run scripts/build-web (needs npm)"
    admin = token(server)
    r = httpx.post(server.url + "/api/v1/users", json={"username": "alice", "password": "password-123"}, headers=admin)
    assert r.status_code == 201, r.text
    theirs = httpx.post(server.url + "/api/v1/jobs", json={"name": "admins", "command": "true"}, headers=admin)
    page, violations = signed_in_page(browser, server, "alice", "password-123")
    _shot(page, "home")

    page.click("text=Batch job")
    page.fill("input[name=name]", "bad name!")
    page.fill("input[name=command]", "true")
    page.click("#submit")
    error = page.wait_for_selector('.field-err[data-field="name"]')
    assert "pattern" in error.inner_text()
    _shot(page, "new-job-error")

    # the job prints a line, waits, prints another: the first must show up while it still runs
    page.fill("input[name=name]", "hello")
    page.fill("input[name=command]", "sh -c 'echo first-line; sleep 4; echo second-line'")
    page.click("#submit")
    page.wait_for_url("**/jobs/*")
    jid = page.url.rsplit("/", 1)[1]
    page.wait_for_selector("#log:has-text('first-line')", timeout=60_000)  # selectors: the CSP forbids eval
    running = httpx.get(f"{server.url}/api/v1/jobs/{jid}", headers=admin).json()
    assert running["state"] == "Running" and "second-line" not in page.inner_text("#log")
    page.wait_for_selector("#log[data-done=true]", timeout=60_000)
    assert page.inner_text("#log").split() == ["first-line", "second-line"]
    page.wait_for_selector("#state:text('Succeeded')", timeout=30_000)  # the HTMX refresh of the status
    assert "Succeeded" in page.inner_text("#events")
    _shot(page, "job")

    # someone else's job: not there, neither the page nor its log
    r = page.goto(f"{server.url}/jobs/{theirs.json()['id']}")
    assert r.status == 404 and "admins" not in page.content()
    r = page.goto(f"{server.url}/api/v1/jobs/{theirs.json()['id']}/logs")
    assert r.status == 404
    assert page.goto(server.url + "/admin/users").status == 403

    page.goto(server.url + "/")
    page.click("button[name=lang][value=zh]")
    page.wait_for_selector("text=alice 的作业")
    assert page.inner_text("#logout").strip() == "退出登录"  # after its icon
    _shot(page, "home-zh")
    page.goto(server.url + "/new/batch")  # remembered on the next page
    assert "新建作业" in page.inner_text("h1")
    page.click("button[name=lang][value=en]")
    page.click("#logout")
    page.wait_for_url("**/login")

    _login(page, server, "admin", "admin-password")
    page.wait_for_selector("text=Jobs of admin")
    page.goto(server.url + "/admin/queue?name=default")
    page.fill("#quota-rows tbody tr:nth-child(1) input[name=key]", "gpu")
    page.fill("#quota-rows tbody tr:nth-child(1) input[name=capability]", "abc")
    page.click("#save")
    page.wait_for_selector("text=Not saved")
    page.fill("#quota-rows tbody tr:nth-child(1) input[name=capability]", "1")
    page.fill("input[name=max_gpus]", "1")
    page.click("#save")
    page.wait_for_url("**/admin/queues")
    assert "gpu: 0 / - / 1" in page.inner_text("tr[data-queue=default] .quotas")
    _shot(page, "admin-queues")
    q = httpx.get(server.url + "/api/v1/queues/default", headers=admin).json()
    assert q["quotas"]["gpu"]["capability"] == 1 and q["user_caps"]["max_gpus"] == 1
    for name in ("users", "nodes"):
        page.goto(f"{server.url}/admin/{name}")
        _shot(page, f"admin-{name}")
    for path, name in (("/new/distributed", "new-distributed"), ("/new/jupyter", "new-jupyter"), ("/tokens", "tokens")):
        page.goto(server.url + path)
        _shot(page, name)
    assert not violations, violations
    page.context.close()


def test_yaml_templates_queue_and_admin_pages_in_the_browser(server, browser):  # noqa: F811
    """The form's extra buttons post the same form elsewhere (formaction): YAML view, save as template; then start
    from the template, the queue view, accounts, and the admin's all-jobs and audit pages, with screenshots."""
    admin = token(server)
    r = httpx.put(server.url + "/api/v1/queues/default", json={"account": "default", "weight": 2}, headers=admin)
    assert r.status_code == 200, r.text
    page, violations = signed_in_page(browser, server, "admin", "admin-password")

    page.goto(server.url + "/new/batch")
    page.fill("input[name=name]", "sweep")
    page.fill("input[name=command]", "python sweep.py --lr 0.1")
    page.fill("textarea[name=env]", "SEED=1")
    page.click("#export-yaml")
    page.wait_for_selector("text=python sweep.py --lr 0.1")
    assert "SEED: '1'" in page.inner_text("body")
    page.go_back()
    page.wait_for_selector("#save-template")
    page.click("#save-template")
    page.wait_for_url("**/templates")
    _shot(page, "templates")
    page.click("#templates a.use")
    page.wait_for_selector("input[name=name][value=sweep]")
    assert page.input_value("input[name=command]") == "python sweep.py --lr 0.1"
    _shot(page, "new-job-from-template")
    page.click("#submit")
    page.wait_for_url("**/jobs/*")
    page.wait_for_selector("#job-yaml")

    for path, name in (("/queue", "queue"), ("/accounts", "accounts"), ("/admin/jobs?user=admin", "admin-jobs"),
                       ("/admin/audit", "admin-audit")):  # fmt: skip
        assert page.goto(server.url + path).status == 200, path
        _shot(page, name)
    assert "put-queue" in page.inner_text("#audit")
    assert not violations, violations
    page.context.close()
