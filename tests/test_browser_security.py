"""Attacks from a browser, in Debian's chromium, each with a control in the same test: the same script, run where
the protection does not apply, succeeds, so that only the protection refuses the attack.

* A notebook's JavaScript acting as the admin who opened the lab, against the platform on the same site (as
  caldera.example.edu beside *.lab.example.edu): the browser sends the platform's cookie, the CSRF check refuses.
* A page of another origin driving a lab the victim has open: another user's lab, whose owner replaced Lab with a
  server of their own (issue 21, finding 5), and another port of the lab's own host. The browser sends the lab's
  cookie to both (same site; cookies ignore ports), and Jupyter's XSRF check is beaten by setting its cookie from
  there; the lab's own origin checks refuse.
"""

import http.server
import json
import socket
import threading
import uuid

import httpx
import pytest
from websockets.sync.client import connect

from tests.conftest import ServerProcess, free_port, kill_job_processes, lab_client, server_env, traversable
from tests.test_browser import browser  # noqa: F401 - the chromium fixture
from tests.test_server_process import lab_xsrf, token, until

pytestmark = [pytest.mark.parametrize("db_url", ["sqlite"], indirect=True), pytest.mark.jupyter]


def _login(page, platform_url, username, password, next_path):
    page.goto(f"{platform_url}/login?next={next_path}")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")


def _lab_jobs(server, *owners):
    """A running lab of each owner's (started together: a lab takes a while)."""
    spec = {"name": "lab", "kind": "jupyter"}
    jids = [httpx.post(f"{server.url}/api/v1/jobs", json=spec, headers=h).json()["id"] for h in owners]
    for jid, h in zip(jids, owners):
        until(server, h, jid, {"Running"}, timeout=240)
    return jids


def _user(server, admin, name):
    r = httpx.post(server.url + "/api/v1/users", json={"username": name, "password": "password-123"}, headers=admin)
    assert r.status_code == 201, r.text
    return token(server, name, "password-123")


@pytest.fixture
def server_beside_labs(tmp_path, db_url):
    """The platform on the labs' site (platform-caldera.lab.localhost beside <job>.lab.localhost), as a university
    puts caldera.example.edu beside *.lab.example.edu: a lab page's requests to it carry its session cookie."""
    port = free_port()
    env = {**server_env(tmp_path, db_url), "CALDERA_PUBLIC_URL": f"http://platform-caldera.lab.localhost:{port}"}
    srv = ServerProcess(traversable(tmp_path) / "data", port, env).start()
    yield srv
    srv.stop()
    kill_job_processes(srv.data_dir)


# What a script can do to the platform with the cookies of whoever runs it: create an admin, once through the API
# (a JSON body: the browser asks first, CORS) and once through the admin page's form (a simple request, sent
# with the cookies without asking)
ACT_AS_ADMIN = """async ([platform, name]) => {
    const out = {cookies: document.cookie};
    const body = JSON.stringify({username: name + "-api", password: "password-123", role: "admin"});
    try {
        const r = await fetch(platform + "/api/v1/users", {method: "POST", credentials: "include", body,
                                                           headers: {"Content-Type": "application/json"}});
        out.api = r.status;
    } catch (e) { out.api = "blocked"; }
    const form = new URLSearchParams({username: name + "-form", password: "password-123", role: "admin"});
    await fetch(platform + "/admin/users", {method: "POST", mode: "no-cors", credentials: "include", body: form})
        .then(() => out.form = "sent", () => out.form = "failed");
    return out;
}"""


def test_notebook_javascript_cannot_act_as_the_admin(server_beside_labs, browser):  # noqa: F811
    server, platform = server_beside_labs, server_beside_labs.env["CALDERA_PUBLIC_URL"]
    admin = token(server)
    [jid] = _lab_jobs(server, _user(server, admin, "alice"))
    page = browser.new_context().new_page()
    _login(page, platform, "admin", "admin-password", f"/jobs/{jid}/lab/lab")  # the admin opens alice's lab
    page.wait_for_selector(".jp-Launcher", timeout=90_000)
    assert page.url.startswith(server.lab_url(jid))  # served from the lab's own origin, not the platform's
    session = [c for c in page.context.cookies(platform) if c["name"] == "caldera_session"]
    assert session and session[0]["sameSite"] == "Lax"  # same site: sent along with the lab page's requests

    attack = page.evaluate(ACT_AS_ADMIN, [platform, "evil"])  # what a notebook's output can run, in the lab page
    home = page.context.new_page()
    home.goto(f"{platform}/")
    control = home.evaluate(ACT_AS_ADMIN, [platform, "control"])  # the same script on the platform's own page

    assert "caldera_session" not in attack["cookies"] and "caldera_lab" not in attack["cookies"]  # HttpOnly too
    assert attack["api"] == "blocked" and attack["form"] == "sent", attack
    assert control["api"] == 201 and control["form"] == "sent", control
    users = {u["username"] for u in httpx.get(server.url + "/api/v1/users", headers=admin).json()}
    assert {"control-api", "control-form"} <= users  # the admin's cookie does all this from the platform's origin
    assert not {"evil-api", "evil-form"} & users  # and none of it from the lab's
    httpx.post(f"{server.url}/api/v1/jobs/{jid}/cancel", headers=admin)


# What a page can do to the lab at `base` with the cookies the browser holds: start a kernel (a simple POST: no
# preflight, Jupyter's XSRF token in the query and its cookie set from here), read the lab's files, run code on a
# kernel and open a terminal whose ids it learnt, and run a script file of the lab as its own
DRIVE = """async ({base, kernel, terminal, label}) => {
    const out = {};
    document.cookie = "_xsrf=c0ffee; Domain=lab.localhost; Path=/";
    document.cookie = "_xsrf=c0ffee; Path=/";  // this host's, whatever its port
    await fetch(`${base}/api/kernels?_xsrf=c0ffee`, {method: "POST", mode: "no-cors", credentials: "include",
                                                    body: "{}", headers: {"Content-Type": "text/plain"}})
        .then(() => out.post = "sent", () => out.post = "failed");
    try {
        const r = await fetch(`${base}/api/contents`, {credentials: "include"});
        out.read = r.status + " " + (await r.text()).slice(0, 500);
    } catch (e) { out.read = "blocked"; }
    const ws = base.replace(/^http/, "ws");
    const open = (url, first) => new Promise(resolve => {
        const sock = new WebSocket(url);
        const done = (how) => { resolve(how); try { sock.close(); } catch (e) {} };
        sock.onopen = () => { sock.send(first); setTimeout(() => done("open"), 3000); };
        sock.onclose = (e) => done("closed " + e.code);
        setTimeout(() => done("timeout"), 20000);
    });
    const run = {header: {msg_id: label, msg_type: "execute_request", username: "u", session: label, version: "5.3"},
                 parent_header: {}, metadata: {}, channel: "shell",
                 content: {code: `open("pwned-${label}.txt", "w").write("${label}")`, silent: false,
                           store_history: false, user_expressions: {}, allow_stdin: false}};
    out.kernel = await open(`${ws}/api/kernels/${kernel}/channels`, JSON.stringify(run));
    out.terminal = await open(`${ws}/terminals/websocket/${terminal}`, JSON.stringify(["stdin", "\\r"]));
    window.leaked = undefined;
    out.script = await new Promise(resolve => {
        const s = document.createElement("script");
        s.src = `${base}/files/leak.js?_xsrf=c0ffee&${label}`;  // Jupyter's XSRF check covers /files/ too
        s.onload = () => resolve("ran " + window.leaked);
        s.onerror = () => resolve("refused");
        document.head.appendChild(s);
    });
    return out;
}"""

# a server mallory starts from her notebook (detached from the kernel, which Lab may stop), serving a page of hers
# at a host of her lab's name on a port of her own: an origin of the labs' site (process jobs share the host's
# network). Replacing Lab on her lab's socket no longer works: the platform reaches Lab through a link it pinned
# to Lab's own socket (tests/runtime/test_process_isolation.py), so that only breaks her own lab
MALLORYS_SERVER = r"""
import socket
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(16)
print(listener.getsockname()[1], flush=True)
page = b"<!doctype html><title>mallory's lab</title><p>nothing to see here"
while True:
    conn, _ = listener.accept()
    try:
        conn.settimeout(5)
        conn.recv(65536)
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nConnection: close\r\nContent-Length: %d\r\n\r\n"
        conn.sendall(head % len(page) + page)
    except OSError:
        pass
    conn.close()
"""
SERVE_PAGE = f"""
import subprocess, sys
server = subprocess.Popen([sys.executable, "-c", {MALLORYS_SERVER!r}], start_new_session=True,
                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
print(server.pid, server.stdout.readline().strip())
"""


def _execute(server, jid, kernel, h, code) -> str:
    """Run code on a kernel of a lab over its websocket, as its owner's notebook does; its printed output."""
    url = f"ws://{jid}.lab.localhost:{server.lab_port}/jobs/{jid}/lab/api/kernels/{kernel}/channels"
    sock = socket.create_connection(("127.0.0.1", server.lab_port))  # *.localhost, as a browser resolves it
    with connect(url, sock=sock, additional_headers=h) as ws:
        msg_id = uuid.uuid4().hex
        header = {"msg_id": msg_id, "msg_type": "execute_request", "username": "u", "session": "s", "version": "5.3"}
        content = {"code": code, "silent": False, "store_history": False, "user_expressions": {}}
        ws.send(json.dumps({"header": header, "parent_header": {}, "metadata": {}, "content": content}))
        while True:
            m = json.loads(ws.recv(timeout=60))
            if m.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if m["msg_type"] == "stream":
                return m["content"]["text"]
            if m["msg_type"] == "error":
                raise AssertionError(m["content"])


class _Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        body = b"<!doctype html><title>another port</title>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_page_of_another_origin_cannot_drive_a_lab(server, browser):  # noqa: F811
    admin = token(server)
    alice, mallory = _user(server, admin, "alice"), _user(server, admin, "mallory")
    lab, evil = _lab_jobs(server, alice, mallory)
    base = f"{server.lab_url(lab)}/jobs/{lab}/lab"
    with lab_client() as client:  # alice's kernel, terminal and a script file of hers: their ids leaked, say
        headers = lab_xsrf(client, base, alice)
        kernel = client.post(f"{base}/api/kernels", json={"name": "python3"}, headers=headers).json()["id"]
        terminal = client.post(f"{base}/api/terminals", headers=headers).json()["name"]
        leak = {"type": "file", "format": "text", "content": 'window.leaked = "alice\'s secret";'}
        assert client.put(f"{base}/api/contents/leak.js", json=leak, headers=headers).status_code in (200, 201)
        mallorys_base = f"{server.lab_url(evil)}/jobs/{evil}/lab"
        headers = lab_xsrf(client, mallorys_base, mallory)
        own = client.post(f"{mallorys_base}/api/kernels", json={"name": "python3"}, headers=headers).json()["id"]
    # mallory, from her own notebook, serves a page of hers on a port of her own
    _, port = _execute(server, evil, own, mallory, SERVE_PAGE).split()
    mallorys_origin = f"http://{evil}.lab.localhost:{port}"
    pages = []
    try:
        # the victim, the admin, has alice's lab open, then opens mallory's
        victim = browser.new_context()
        alices_tab = victim.new_page()
        _login(alices_tab, server.url, "admin", "admin-password", f"/jobs/{lab}/lab/lab")
        alices_tab.wait_for_selector(".jp-Launcher", timeout=90_000)
        mallorys_page = victim.new_page()
        mallorys_page.goto(f"{mallorys_origin}/")
        mallorys_page.wait_for_selector("text=nothing to see here")  # her page, on an origin of the labs' site
        args = {"base": base, "kernel": kernel, "terminal": terminal}

        kernels_before = _kernels(base, alice)
        from_mallorys_lab = mallorys_page.evaluate(DRIVE, {**args, "label": "mallory"})
        # another port of alice's lab's own host: the browser sends her lab's cookie there too
        other_port = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)
        threading.Thread(target=other_port.serve_forever, daemon=True).start()
        pages.append(other_port)
        port_page = victim.new_page()
        port_page.goto(f"http://{lab}.lab.localhost:{other_port.server_address[1]}/")
        from_another_port = port_page.evaluate(DRIVE, {**args, "label": "port"})
        kernels_after_attacks = _kernels(base, alice)
        # the control: the same script in alice's lab's own page
        from_the_lab = alices_tab.evaluate(DRIVE, {**args, "label": "lab"})
        kernels_after_control = _kernels(base, alice)
        files = {f["name"] for f in _files(base, alice)}
    finally:
        for p in pages:
            p.shutdown()
        # her server's pid is one of her job's pid namespace: ending her job ends it (and alice's lab with it)
        for jid in (lab, evil):
            httpx.post(f"{server.url}/api/v1/jobs/{jid}/cancel", headers=admin)

    assert from_the_lab["post"] == "sent" and kernels_after_control == kernels_after_attacks + 1, from_the_lab
    assert from_the_lab["read"].startswith("200 ") and "leak.js" in from_the_lab["read"], from_the_lab
    assert from_the_lab["kernel"] == "open" and from_the_lab["terminal"] == "open", from_the_lab
    assert from_the_lab["script"] == "ran alice's secret", from_the_lab
    for attack in (from_mallorys_lab, from_another_port):
        assert attack["read"] == "blocked", attack
        assert attack["kernel"] != "open" and attack["terminal"] != "open", attack
        assert attack["script"] == "refused", attack
    assert kernels_after_attacks == kernels_before  # their simple POSTs started nothing
    assert "pwned-lab.txt" in files and not {"pwned-mallory.txt", "pwned-port.txt"} & files, files


def _kernels(base, h) -> int:
    with lab_client() as client:
        return len(client.get(f"{base}/api/kernels", headers=h).json())


def _files(base, h) -> list[dict]:
    with lab_client() as client:
        return client.get(f"{base}/api/contents", headers=h).json()["content"]
