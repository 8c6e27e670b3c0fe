"""Cross-site requests with the browser's cookie, framing and sniffing, oversized bodies: against the app and the
real `caldera up` server."""

import httpx
import pytest

from caldera.server.csrf import CSRF_COOKIE, CSRF_FIELD, CSRF_HEADER

ORIGIN = "http://127.0.0.1:8642"  # make_settings: the platform's public URL
JOB = {"name": "j", "command": "true"}


@pytest.fixture
def session(api, admin):
    """alice's browser: a session cookie and the CSRF cookie, as a real login leaves them."""
    api.user(admin, "alice")
    assert api.client.get("/login").status_code == 200
    r = api.client.post("/login", data={"username": "alice", "password": "password-123"}, headers={"Origin": ORIGIN})
    assert r.status_code == 200  # followed to the jobs page
    assert api.client.cookies.get("caldera_session") and api.client.cookies.get(CSRF_COOKIE)
    yield api.client
    api.client.cookies.clear()


def test_cookie_requests_from_another_origin_are_refused(session, api):
    for headers in (
        {},  # no Origin, no Referer, no token
        {"Origin": "http://evil.example"},
        {"Origin": "http://0123456789.lab.localhost:8643"},  # a lab's origin, where notebooks' JavaScript runs
        {"Origin": "null"},
        {"Referer": "http://evil.example/page"},
        {"Origin": "http://evil.example", CSRF_HEADER: session.cookies[CSRF_COOKIE]},  # a named origin decides
        {CSRF_HEADER: "not-the-token"},
    ):
        r = session.post("/api/v1/jobs", json=JOB, headers=headers)
        assert r.status_code == 403 and "CSRF" in r.json()["detail"], headers
        assert session.post("/logout", headers=headers, follow_redirects=False).status_code == 403
    assert session.get("/api/v1/jobs").json() == []  # nothing was created; reading is not state-changing


def test_cookie_requests_of_the_platform_itself_pass(session):
    for headers in (
        {"Origin": ORIGIN},
        {"Origin": "http://testserver"},  # the scheme and Host it was sent to
        {"Referer": ORIGIN + "/"},
        {CSRF_HEADER: session.cookies[CSRF_COOKIE]},
    ):
        r = session.post("/api/v1/jobs", json=JOB, headers=headers)
        assert r.status_code == 201, (headers, r.text)
    # a form without Origin or Referer passes with the double-submit field
    r = session.post("/logout", data={CSRF_FIELD: session.cookies[CSRF_COOKIE]}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/login"


def test_bearer_requests_are_exempt_and_login_forms_are_checked(api, admin):
    api.client.cookies.clear()
    assert api.client.post("/api/v1/jobs", json=JOB, headers=admin).status_code == 201
    # a forged login (the attacker's account in the victim's browser) is refused
    r = api.client.post(
        "/login",
        data={"username": "admin", "password": "admin-password"},
        headers={"Origin": "http://evil.example"},
        follow_redirects=False,
    )
    assert r.status_code == 403 and "caldera_session" not in r.cookies


def test_platform_pages_and_api_carry_security_headers(api, platform):
    for path in ("/login", "/api/v1/health", "/api/v1/openapi.json", "/nope"):
        h = api.client.get(path).headers
        assert h["x-frame-options"] == "DENY", path
        assert h["x-content-type-options"] == "nosniff"
        assert h["referrer-policy"] == "same-origin"
        csp = h["content-security-policy"]
        assert "frame-ancestors 'none'" in csp and "default-src 'self'" in csp and "script-src 'self';" in csp
    assert "cdn.jsdelivr.net" in api.client.get("/api/v1/docs").headers["content-security-policy"]
    assert "cdn.jsdelivr.net" not in api.client.get("/login").headers["content-security-policy"]


def test_lab_origin_shares_the_header_code(platform):
    from fastapi.testclient import TestClient

    from caldera.server.lab_app import create_lab_app

    with TestClient(create_lab_app(platform)) as lab:
        h = lab.get("/_caldera/lab-login").headers
        assert h["x-content-type-options"] == "nosniff" and h["referrer-policy"] == "same-origin"
        assert "x-frame-options" not in h  # Lab frames its own pages


def test_oversized_bodies_are_413(api, admin):
    big = b'{"name": "j", "command": "' + b"x" * (1024 * 1024) + b'"}'
    r = api.client.post("/api/v1/jobs", content=big, headers={**admin, "Content-Type": "application/json"})
    assert r.status_code == 413 and "larger than 1048576 bytes" in r.json()["detail"]

    def chunks():
        yield b'{"name": "j", "command": "'
        for _ in range(40):
            yield b"x" * 32768
        yield b'"}'

    r = api.client.post("/api/v1/jobs", content=chunks(), headers={**admin, "Content-Type": "application/json"})
    assert r.status_code == 413
    r = api.client.post("/login", content=big, headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 413  # before the CSRF check reads a form
    assert api.client.get("/api/v1/jobs", headers=admin).json() == []


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_real_server_limits_chunked_bodies_and_checks_origin(server):
    def chunks():
        yield b'{"name": "j", "command": "'
        for _ in range(64):
            yield b"x" * 32768
        yield b'"}'

    tok = httpx.post(server.url + "/api/v1/auth/login", json={"username": "admin", "password": "admin-password"})
    h = {"Authorization": f"Bearer {tok.json()['access_token']}", "Content-Type": "application/json"}
    r = httpx.post(server.url + "/api/v1/jobs", content=chunks(), headers=h)
    assert r.status_code == 413, r.text
    with httpx.Client(base_url=server.url) as browser:
        assert browser.get("/login").headers["x-frame-options"] == "DENY"
        r = browser.post("/login", data={"username": "admin", "password": "admin-password"})
        assert r.status_code == 403  # no Origin, no Referer, no token
        r = browser.post(
            "/login", data={"username": "admin", "password": "admin-password"}, headers={"Origin": server.url}
        )
        assert r.status_code == 303 and "caldera_session" in r.cookies
        r = browser.post("/api/v1/jobs", json=JOB, headers={"Origin": server.lab_url("0123456789")})
        assert r.status_code == 403
        r = browser.post("/api/v1/jobs", json=JOB, headers={"Origin": server.url})
        assert r.status_code == 201, r.text
