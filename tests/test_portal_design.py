"""The portal's design in a real browser (Debian's chromium): every page passes axe-core with no serious or critical
violation in English and Chinese, light and dark; no page scrolls sideways at 1280x800 or at a phone's 390x844; the
keyboard reaches the content first; a newcomer starts a first job from the home page's empty state. Screenshots of
every page in every combination go to test-output/portal/ (git-ignored)."""

import re

import httpx
import pytest

from caldera.server.web.render import STATIC
from tests.test_browser import browser  # noqa: F401 - the chromium fixture
from tests.test_portal_browser import SHOTS, _login
from tests.test_server_process import token

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
AXE = STATIC / "vendor" / "axe.min.js"
SIZES = {"desktop": (1280, 800), "phone": (390, 844)}
LOCALES = {"en": "en-US", "zh": "zh-CN"}
PAGES = {
    "home": "/", "jobs": "/jobs?sort=name", "queue": "/queue", "new-batch": "/new/batch",
    "new-distributed": "/new/distributed", "new-jupyter": "/new/jupyter", "images": "/images",
    "templates": "/templates", "tokens": "/tokens", "data": "/data", "files": "/files",
    "files-space": "/files/personal:admin", "files-preview": "/files/personal:admin/preview?path=notes.txt",
    "accounts": "/accounts", "job": "/jobs/{jid}", "admin-users": "/admin/users", "admin-accounts": "/admin/accounts",
    "admin-queues": "/admin/queues", "admin-queue": "/admin/queue?name=default", "admin-nodes": "/admin/nodes",
    "admin-jobs": "/admin/jobs", "admin-audit": "/admin/audit", "approvals": "/approvals",
    "low-utilisation": "/low-utilisation", "array": "/arrays/{aid}",
}  # fmt: skip
SERIOUS = """async () => (await axe.run(document, {resultTypes: ["violations"]})).violations
    .filter(v => v.impact === "serious" || v.impact === "critical")
    .map(v => v.id + ": " + v.nodes.slice(0, 3).map(n => n.target.join(" ")).join(", "))"""


def _context(chromium, lang, scheme, size):
    w, h = SIZES[size]
    return chromium.new_context(locale=LOCALES[lang], color_scheme=scheme, viewport={"width": w, "height": h})


@pytest.mark.timeout(600)  # 26 pages in 8 combinations: about 5 minutes on a loaded 2-core machine
def test_every_page_is_accessible_and_fits_in_both_languages_and_themes(server, browser):  # noqa: F811
    assert AXE.exists(), "no axe-core: run scripts/build-web (needs npm)"
    admin = token(server)
    jid = httpx.post(server.url + "/api/v1/jobs", json={"name": "train", "command": "true"}, headers=admin).json()["id"]
    sweep = {"spec": {"name": "sweep", "command": "true"}, "array": "0-2%1"}
    aid = httpx.post(server.url + "/api/v1/arrays", json=sweep, headers=admin).json()["id"]
    notes = {"path": "notes.txt", "size": 0}  # an empty file, for the file browser's preview
    assert httpx.post(server.url + "/api/v1/spaces/personal/uploads", json=notes, headers=admin).status_code == 201
    axe = AXE.read_text()
    problems: list[str] = []
    for lang in LOCALES:
        for scheme in ("light", "dark"):
            for size in SIZES:
                ctx = _context(browser, lang, scheme, size)
                page = ctx.new_page()
                _login(page, server, "admin", "admin-password")
                page.wait_for_url(server.url + "/")
                for name, path in PAGES.items():
                    r = page.goto(server.url + path.format(jid=jid, aid=aid))
                    assert r.status == 200, (name, r.status)
                    where = f"{name} {lang} {scheme} {size}"
                    theme = page.evaluate("document.documentElement.dataset.bsTheme")
                    assert theme == scheme, where  # follows the browser's preference
                    page.evaluate("document.fonts.ready.then(() => true)")  # widths with the fonts they will have
                    wide = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
                    if wide > 0:
                        problems.append(f"{where}: scrolls sideways by {wide}px")
                    if size == "desktop":  # the rules do not depend on the width; colours depend on the theme
                        page.evaluate(axe)  # evaluated by the test driver: the page's CSP stays as it is
                        problems += [f"{where}: {v}" for v in page.evaluate(SERIOUS)]
                    SHOTS.mkdir(parents=True, exist_ok=True)
                    page.screenshot(path=str(SHOTS / f"{name}-{lang}-{scheme}-{size}.png"), full_page=True)
                ctx.close()
    assert not problems, "\n".join(problems)


def test_keyboard_reaches_the_content_and_the_navigation(server, browser):  # noqa: F811
    page = _context(browser, "en", "light", "desktop").new_page()
    _login(page, server, "admin", "admin-password")
    page.wait_for_url(server.url + "/")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.getAttribute('href')") == "#main"  # the skip link comes first
    page.keyboard.press("Enter")
    assert page.url.endswith("#main")
    seen = set()
    for _ in range(40):  # every link of the navigation is on the tab path
        page.keyboard.press("Tab")
        seen.add(page.evaluate("document.activeElement.getAttribute('href')"))
    assert {"/new/batch", "/images", "/admin/users"} <= seen, seen
    page.context.close()


def test_a_newcomer_starts_a_first_job_from_the_empty_home(server, browser):  # noqa: F811
    admin = token(server)
    r = httpx.post(server.url + "/api/v1/users", json={"username": "newbie", "password": "password-123"}, headers=admin)
    assert r.status_code == 201, r.text
    page = _context(browser, "en", "light", "phone").new_page()
    violations: list[str] = []
    page.on("console", lambda m: "Content Security Policy" in m.text and violations.append(m.text))
    _login(page, server, "newbie", "password-123")
    empty = page.wait_for_selector("#first-job")
    assert "Start your first job" in empty.inner_text()
    assert not page.query_selector("#active-jobs")
    page.click("#first-job >> text=Run a script")
    page.wait_for_url("**/new/batch")
    page.click("#presets .preset:first-child")  # a preset fills the resources
    assert page.input_value("#cpu") == "2" and page.input_value("#memory_mib") == "4096"
    page.fill("#name", "bad name!")  # said while typing, before any submit, by the server's own rules
    page.wait_for_selector("#name.is-invalid[aria-invalid=true]")
    assert "pattern" in page.inner_text(".field-err.live[data-field=name]")
    page.fill("#name", "my-first-job")
    page.wait_for_selector("#name:not(.is-invalid)")
    assert not page.query_selector(".field-err.live")
    page.fill("#command", "sh -c 'echo hello-newcomer; sleep 15'")
    page.click("#submit")
    page.wait_for_url("**/jobs/*")
    page.wait_for_selector("#log:has-text('hello-newcomer')", timeout=60_000)
    page.goto(server.url + "/")
    card = page.wait_for_selector("#active-jobs .job-card")  # the home page now shows it, no longer empty
    assert "my-first-job" in card.inner_text() and not page.query_selector("#first-job")
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "newcomer-first-job-card.png"), full_page=True)
    assert not violations, violations
    page.context.close()


def test_the_forms_check_every_field_as_one_types_in_the_readers_language(server, browser):  # noqa: F811
    """The job form's and the image form's fields are checked by the server as one types (the submit's own
    code: /new/<kind>/check, /images/check), the messages in Chinese for a Chinese reader; nothing is recorded."""
    page = _context(browser, "zh", "light", "desktop").new_page()
    _login(page, server, "admin", "admin-password")
    page.wait_for_url(server.url + "/")
    page.goto(server.url + "/new/batch")
    page.fill("#memory_mib", "-5")
    assert re.search("[\u4e00-\u9fff]", page.wait_for_selector(".field-err.live[data-field=memory_mib]").inner_text())
    page.fill("#env", "NOT A PAIR")
    assert "KEY=VALUE" in page.wait_for_selector(".field-err.live[data-field=env]").inner_text()
    assert not page.query_selector(".field-err.live[data-field=name]")  # untouched fields are left alone
    page.goto(server.url + "/images")
    page.fill("#image-pip", "six;rm")
    said = page.wait_for_selector(".field-err.live[data-field=pip]").inner_text()
    assert "six;rm" in said and re.search("[\u4e00-\u9fff]", said), said
    page.fill("#image-tag", "-bad")
    page.wait_for_selector("#image-tag[aria-invalid=true]")
    page.fill("#image-pip", "six")
    page.wait_for_selector("#image-pip:not([aria-invalid])")
    jobs = httpx.get(server.url + "/api/v1/jobs?all=true", headers=token(server)).json()
    assert jobs == [] and httpx.get(server.url + "/api/v1/images", headers=token(server)).json() == []
    page.context.close()
