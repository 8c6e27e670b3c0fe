"""Attacks from a browser, in Debian's chromium: a notebook's JavaScript acting as the admin who opened it, and a
page of another port of the same host driving someone's lab through its websockets (cross-site websocket
hijacking). Both must fail."""

import http.server
import threading

import httpx
import pytest

from tests.test_browser import browser  # noqa: F401 - the chromium fixture
from tests.test_server_process import lab_xsrf, token, until

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def _login(page, server, username, password, next_path):
    page.goto(f"{server.url}/login?next={next_path}")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")


def _lab_job(server, h):
    jid = httpx.post(server.url + "/api/v1/jobs", json={"name": "lab", "kind": "jupyter"}, headers=h).json()["id"]
    until(server, h, jid, {"Running"}, timeout=120)
    return jid


def test_notebook_javascript_cannot_act_as_the_admin(server, browser):  # noqa: F811
    admin = token(server)
    httpx.post(server.url + "/api/v1/users", json={"username": "alice", "password": "password-123"}, headers=admin)
    alice = token(server, "alice", "password-123")
    jid = _lab_job(server, alice)
    page = browser.new_page()
    _login(page, server, "admin", "admin-password", f"/jobs/{jid}/lab/lab")  # the admin opens alice's lab
    page.wait_for_selector(".jp-Launcher", timeout=90_000)
    assert page.url.startswith(server.lab_url)  # served from the lab origin, not the platform's

    # what a notebook's JavaScript output can do, run in the lab page itself
    result = page.evaluate(
        """async ([platform]) => {
        const out = {cookies: document.cookie};
        const body = JSON.stringify({username: "evil", password: "password-123", role: "admin"});
        for (const [name, url] of [["platform", platform + "/api/v1/users"], ["here", "/api/v1/users"]]) {
            try {
                const r = await fetch(url, {method: "POST", credentials: "include", body,
                                            headers: {"Content-Type": "application/json"}});
                out[name] = r.status;
            } catch (e) { out[name] = "blocked"; }
        }
        try {
            await fetch(platform + "/api/v1/users", {method: "POST", mode: "no-cors", credentials: "include",
                                                     body, headers: {"Content-Type": "text/plain"}});
            out.nocors = "sent";
        } catch (e) { out.nocors = "blocked"; }
        return out;
    }""",
        [server.url],
    )
    assert "caldera_session" not in result["cookies"] and "caldera_lab" not in result["cookies"]  # HttpOnly too
    assert result["platform"] == "blocked" and result["here"] == 404, result
    users = httpx.get(server.url + "/api/v1/users", headers=admin).json()
    assert "evil" not in [u["username"] for u in users]
    httpx.post(f"{server.url}/api/v1/jobs/{jid}/cancel", headers=alice)


class _EvilPage(http.server.BaseHTTPRequestHandler):
    html = b""

    def do_GET(self):  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(self.html)

    def log_message(self, *args):
        pass


def test_another_port_cannot_drive_a_lab(server, browser):  # noqa: F811
    h = token(server)
    jid = _lab_job(server, h)
    base = f"{server.lab_url}/jobs/{jid}/lab"
    with httpx.Client() as client:
        r = client.post(f"{base}/api/kernels", json={"name": "python3"}, headers=lab_xsrf(client, base, h))
        assert r.status_code == 201, r.text
        kernel = r.json()["id"]
    page = browser.new_context().new_page()
    _login(page, server, "admin", "admin-password", f"/jobs/{jid}/lab/lab")  # the victim has a lab cookie
    page.wait_for_selector(".jp-Launcher", timeout=90_000)

    # a page on another port of the same host: the same site, so the browser would send the lab cookie
    _EvilPage.html = f"""<!doctype html><script>
    window.results = {{}};
    function probe(name, url) {{
        const ws = new WebSocket(url);
        ws.onopen = () => {{ window.results[name] = "open"; ws.send("{{}}"); }};
        ws.onclose = (e) => {{ window.results[name] = window.results[name] || ("closed " + e.code); }};
    }}
    probe("kernel", "ws://localhost:{server.lab_port}/jobs/{jid}/lab/api/kernels/{kernel}/channels");
    probe("terminal", "ws://localhost:{server.lab_port}/jobs/{jid}/lab/terminals/websocket/1");
    fetch("http://localhost:{server.lab_port}/jobs/{jid}/lab/api/terminals", {{method: "POST", mode: "no-cors",
          credentials: "include"}}).then(() => window.results.post = "sent", () => window.results.post = "failed");
    </script>""".encode()
    evil = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _EvilPage)
    threading.Thread(target=evil.serve_forever, daemon=True).start()
    try:
        attacker = page.context.new_page()  # the same browser profile: the victim's cookies
        attacker.goto(f"http://localhost:{evil.server_address[1]}/")
        attacker.wait_for_function("Object.keys(window.results).length === 3", timeout=30_000)
        results = attacker.evaluate("window.results")
    finally:
        evil.shutdown()
    assert not results["kernel"].startswith("open") and not results["terminal"].startswith("open"), results
    with httpx.Client() as client:
        terminals = client.get(f"{base}/api/terminals", headers=h).json()
    assert terminals == [], terminals  # the cross-site POST made no terminal either
    httpx.post(f"{server.url}/api/v1/jobs/{jid}/cancel", headers=h)
