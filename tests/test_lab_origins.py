"""Every lab on an origin of its own (README "Security model"): the labs' server answers only at a lab's own host,
and a lab's ticket and cookie count on that lab's origin only, for their minute or hours, and until their owner's
password changes. Each refusal comes with a control that passes, so that only the protection refuses."""

import time
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from tests.conftest import api_on, lab_client, make_settings
from tests.fake_runtime import FakeRuntime
from tests.test_server_process import token, until

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def _submit(server, h, **body) -> str:
    r = httpx.post(server.url + "/api/v1/jobs", json=body, headers=h)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _ticket(server, h, jid) -> str:
    """The ticket trip as a browser starts it: the platform's own origin sends it to the lab's, with a ticket."""
    r = httpx.get(f"{server.url}/jobs/{jid}/lab/api/status", headers=h)
    assert r.status_code == 303 and r.headers["location"].startswith(f"{server.lab_url(jid)}/_caldera/lab-login?")
    return parse_qs(urlsplit(r.headers["location"]).query)["ticket"][0]


def _enter(server, lab_job, ticket, next_job=None) -> httpx.Response:
    """Present a ticket at ``lab_job``'s host, asking to go on to ``next_job``'s lab (the same one unless named)."""
    with lab_client() as browser:
        return browser.get(
            f"{server.lab_url(lab_job)}/_caldera/lab-login",
            params={"ticket": ticket, "next": f"/jobs/{next_job or lab_job}/lab/api/status"},
        )


def _status(server, host_job, cookie, path_job=None) -> int:
    """Jupyter's status page at ``host_job``'s host with this lab cookie, as a browser would send it there."""
    path = f"/jobs/{path_job or host_job}/lab/api/status"
    with lab_client() as client:
        return client.get(server.lab_url(host_job) + path, headers={"Cookie": f"caldera_lab={cookie}"}).status_code


@pytest.mark.jupyter
def test_a_labs_ticket_and_cookie_count_at_its_own_origin_only(server):
    pytest.importorskip("jupyterlab")
    admin = token(server)
    httpx.post(server.url + "/api/v1/users", json={"username": "alice", "password": "password-123"}, headers=admin)
    alice = token(server, "alice", "password-123")
    # two labs of the same user, so that she may see both: only the binding to one lab can refuse
    a = _submit(server, alice, name="a", kind="jupyter")
    b = _submit(server, alice, name="b", kind="jupyter")
    batch = _submit(server, alice, name="batch", command=["true"])
    stale_ticket, issued = _ticket(server, alice, a), time.time()
    until(server, alice, a, {"Running"}, timeout=120)
    until(server, alice, b, {"Running"}, timeout=120)

    # the labs' server answers only at an existing lab's host, and only for that lab's paths
    with lab_client(headers=alice) as client:
        assert client.get(f"{server.lab_url(a)}/jobs/{a}/lab/api/status").status_code == 200  # the control
        assert client.get(f"http://127.0.0.1:{server.lab_port}/jobs/{a}/lab/api/status").status_code == 404
        assert client.get(f"{server.lab_url('0123456789')}/jobs/{a}/lab/api/status").status_code == 404
        assert client.get(f"{server.lab_url(batch)}/jobs/{batch}/lab/api/status").status_code == 404  # no lab
        assert client.get(f"{server.lab_url(a)}/jobs/{b}/lab/api/status").status_code == 404
        assert client.get(f"{server.lab_url(a)}/_caldera/lab-login?ticket=x&next=/").status_code != 404
        assert client.get(f"{server.lab_url('0123456789')}/_caldera/lab-login?ticket=x&next=/").status_code == 404

    # a's ticket is refused at b's host, whichever lab it asks to go on to, and is not spent by that
    ticket = _ticket(server, alice, a)
    for next_job in (b, a):
        r = _enter(server, b, ticket, next_job)
        assert r.status_code == 401 and "another lab" in r.json()["detail"], r.text
    r = _enter(server, a, ticket)
    assert r.status_code == 303 and r.headers["location"] == f"/jobs/{a}/lab/api/status"
    assert _enter(server, a, ticket).status_code == 401  # one use
    # the cookie: host-only (no Domain attribute), HttpOnly, this lab's path; not Secure over http
    set_cookie = r.headers["set-cookie"]
    assert set_cookie.startswith("caldera_lab=") and f"Path=/jobs/{a}/lab/" in set_cookie
    assert "HttpOnly" in set_cookie and "domain=" not in set_cookie.lower() and "secure" not in set_cookie.lower()
    cookie = r.cookies["caldera_lab"]
    assert _status(server, a, cookie) == 200  # the control: it opens a
    assert _status(server, b, cookie) == 401  # not b, at b's host
    assert _status(server, a, cookie, path_job=b) == 404  # nor b's paths at a's host

    # a ticket after its minute is refused; one of now, by the same user for the same lab, passes
    time.sleep(max(0.0, issued + 61 - time.time()))
    r = _enter(server, a, stale_ticket)
    assert r.status_code == 401 and "expired" in r.json()["detail"], r.text
    assert _enter(server, a, _ticket(server, alice, a)).status_code == 303

    # a new password ends the lab cookies made before it; a new login makes one that opens the lab again
    r = httpx.put(
        f"{server.url}/api/v1/me/password",
        json={"current_password": "password-123", "password": "password-456"},
        headers=alice,
    )
    assert r.status_code == 200, r.text
    assert _status(server, a, cookie) == 401
    fresh = _enter(server, a, _ticket(server, token(server, "alice", "password-456"), a)).cookies["caldera_lab"]
    assert _status(server, a, fresh) == 200
    for jid in (a, b):
        httpx.post(f"{server.url}/api/v1/jobs/{jid}/cancel", headers=admin)


def test_lab_and_session_cookies_are_secure_when_the_public_urls_are_https(tmp_path, db_url):
    from fastapi.testclient import TestClient

    from caldera.server.lab_app import create_lab_app

    platform_url = "https://caldera.example.edu"
    s = make_settings(tmp_path, db_url, public_url=platform_url, lab_public_url="https://{job}.lab.example.edu")
    with api_on(s, FakeRuntime(s)) as (api, admin):
        jid = api.client.post("/api/v1/jobs", json={"name": "lab", "kind": "jupyter"}, headers=admin).json()["id"]
        browser = TestClient(api.client.app, base_url=platform_url)
        r = browser.get("/login")
        assert "Secure" in r.headers["set-cookie"] and r.headers["set-cookie"].startswith("caldera_csrf=")
        form = {"username": "admin", "password": "admin-password", "csrf_token": r.cookies["caldera_csrf"]}
        r = browser.post("/login", data=form, headers={"Origin": platform_url}, follow_redirects=False)
        assert r.status_code == 303 and "Secure" in r.headers["set-cookie"], r.headers
        assert r.headers["set-cookie"].startswith("caldera_session=")
        r = browser.get(f"/jobs/{jid}/lab/lab", follow_redirects=False)
        entry = urlsplit(r.headers["location"])
        assert f"{entry.scheme}://{entry.netloc}" == f"https://{jid}.lab.example.edu"
        with TestClient(create_lab_app(api.client.app.state.platform), base_url=f"https://{entry.netloc}") as lab:
            r = lab.get(f"{entry.path}?{entry.query}", follow_redirects=False)
        assert r.status_code == 303, r.text
        set_cookie = r.headers["set-cookie"]
        assert set_cookie.startswith("caldera_lab=") and "Secure" in set_cookie and "HttpOnly" in set_cookie
        assert "domain=" not in set_cookie.lower()


def test_a_vscode_lab_lives_at_its_origins_root_and_its_login_leads_nowhere_else(tmp_path, db_url):
    """code-server is served at the root of its lab's origin: the way in keeps the path, the cookie is the host's
    whole path, and a ``next`` that a browser reads as another site (``//host``, ``/\\host``) is refused."""
    from fastapi.testclient import TestClient

    from caldera.server.lab_app import create_lab_app

    s = make_settings(tmp_path, db_url)
    with api_on(s, FakeRuntime(s)) as (api, admin):
        jid = api.client.post("/api/v1/jobs", json={"name": "ide", "kind": "vscode"}, headers=admin).json()["id"]
        lab_host = urlsplit(s.lab_url(jid)).netloc

        def entry(path: str) -> tuple[str, str]:
            r = api.client.get(f"/jobs/{jid}/lab/{path}", headers=admin, follow_redirects=False)
            assert r.status_code == 303, r.text
            url = urlsplit(r.headers["location"])
            assert url.netloc == lab_host and url.path == "/_caldera/lab-login"
            query = parse_qs(url.query)
            return query["ticket"][0], query["next"][0]

        platform = api.client.app.state.platform
        with TestClient(create_lab_app(platform), base_url=f"http://{lab_host}") as lab:
            for elsewhere in ("//evil.example/", "/\\evil.example/"):
                r = lab.get("/_caldera/lab-login", params={"ticket": entry("")[0], "next": elsewhere})
                assert r.status_code == 400, (elsewhere, r.text)
            ticket, target = entry("src/main.py?line=3")
            assert target == "/src/main.py?line=3"  # the same place, at the root
            r = lab.get("/_caldera/lab-login", params={"ticket": ticket, "next": target}, follow_redirects=False)
            assert r.status_code == 303 and r.headers["location"] == target
            assert "Path=/;" in r.headers["set-cookie"] + ";" and "domain=" not in r.headers["set-cookie"].lower()
        with TestClient(create_lab_app(platform), base_url=f"http://{lab_host}") as stranger:
            # no cookie: a page of the editor sends the browser to the platform's way in, for the same place
            r = stranger.get("/src/main.py?line=3", headers={"Accept": "text/html"}, follow_redirects=False)
            assert r.status_code == 303 and r.headers["location"] == f"{s.url}/jobs/{jid}/lab/src/main.py?line=3"
            assert stranger.get("/src/main.py").status_code == 401
