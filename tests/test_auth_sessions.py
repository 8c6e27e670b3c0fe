"""Passwords, sessions and logins under attack: a password change ends every other login, logins are rate-limited
and answer as fast for unknown names as for known ones, personal tokens belong to their owner."""

import statistics
import time

import httpx
import pytest
from typer.testing import CliRunner

from caldera.cli.main import app as cli

PLATFORM_ORIGIN = "http://127.0.0.1:8642"  # make_settings: the default CALDERA_PUBLIC_URL


def _pair(api, username, password):
    r = api.client.post("/api/v1/auth/login", json={"username": username, "password": password})
    assert r.status_code == 200, r.text
    return r.json()


def _bearer(token):
    return {"Authorization": f"Bearer {token}"}


def _browser_session(api, username, password):
    r = api.client.post(
        "/login",
        data={"username": username, "password": password},
        headers={"Origin": PLATFORM_ORIGIN},
        follow_redirects=False,
    )
    assert r.status_code == 303 and r.headers["location"] == "/", r.headers
    api.client.cookies.clear()  # kept by the tests, not by the client: later calls are bearer-only
    return r.cookies["caldera_session"]


def _me_with_cookie(api, session):
    api.client.cookies.set("caldera_session", session)
    try:
        return api.client.get("/api/v1/me")
    finally:
        api.client.cookies.clear()


def test_own_password_change_needs_the_current_one(api, admin):
    api.user(admin, "alice")
    tok = _pair(api, "alice", "password-123")["access_token"]
    for body in ({"password": "new-password-1"}, {"current_password": "not-it-at-all", "password": "new-password-1"}):
        r = api.client.put("/api/v1/me/password", json=body, headers=_bearer(tok))
        assert r.status_code == 400 and r.json()["errors"][0]["field"] == "current_password", r.text
    assert _pair(api, "alice", "password-123")  # unchanged
    r = api.client.put(
        "/api/v1/me/password",
        json={"current_password": "password-123", "password": "new-password-1"},
        headers=_bearer(tok),
    )
    assert r.status_code == 200, r.text
    assert _pair(api, "alice", "new-password-1")


def test_password_change_ends_every_other_login(api, admin):
    api.user(admin, "alice")
    pair = _pair(api, "alice", "password-123")
    session = _browser_session(api, "alice", "password-123")
    personal = api.client.post("/api/v1/tokens", json={"name": "cli"}, headers=_bearer(pair["access_token"]))
    personal = personal.json()["token"]
    assert _me_with_cookie(api, session).status_code == 200
    changer = _pair(api, "alice", "password-123")["access_token"]
    time.sleep(0.01)
    r = api.client.put(
        "/api/v1/me/password",
        json={"current_password": "password-123", "password": "new-password-1"},
        headers=_bearer(changer),
    )
    assert r.status_code == 200, r.text
    # access tokens issued before the change (the one that made it too), refresh tokens, browser sessions: gone
    for tok in (pair["access_token"], changer):
        r = api.client.get("/api/v1/me", headers=_bearer(tok))
        assert r.status_code == 401 and "password changed" in r.json()["detail"]
    assert api.client.post("/api/v1/auth/refresh", json={"refresh_token": pair["refresh_token"]}).status_code == 401
    assert _me_with_cookie(api, session).status_code == 401
    # personal tokens are the owner's to revoke; a fresh login works
    assert api.client.get("/api/v1/me", headers=_bearer(personal)).status_code == 200
    fresh = _pair(api, "alice", "new-password-1")
    assert api.client.get("/api/v1/me", headers=_bearer(fresh["access_token"])).status_code == 200
    assert api.client.post("/api/v1/auth/refresh", json={"refresh_token": fresh["refresh_token"]}).status_code == 200


def test_admin_resets_another_users_password_without_theirs(api, admin):
    bob = api.user(admin, "bob")
    alice = api.user(admin, "alice")
    r = api.client.put("/api/v1/users/alice/password", json={"password": "reset-by-admin"}, headers=bob)
    assert r.status_code == 403
    r = api.client.put("/api/v1/users/alice/password", json={"password": "reset-by-admin"}, headers=admin)
    assert r.status_code == 200, r.text
    assert api.client.get("/api/v1/me", headers=alice).status_code == 401
    assert _pair(api, "alice", "reset-by-admin")
    # an admin's own password through the admin route still needs the current one
    r = api.client.put("/api/v1/users/admin/password", json={"password": "new-admin-pass"}, headers=admin)
    assert r.status_code == 400
    r = api.client.put("/api/v1/users/alice/password", json={"password": "short"}, headers=admin)
    assert r.status_code == 400 and "8 characters" in r.text


def test_refresh_token_never_works_as_an_access_token(api, admin):
    pair = _pair(api, "admin", "admin-password")
    for path in ("/api/v1/me", "/api/v1/tokens", "/api/v1/jobs"):
        r = api.client.get(path, headers=_bearer(pair["refresh_token"]))
        assert r.status_code == 401, path


def test_personal_tokens_are_their_owners(api, admin):
    alice = api.user(admin, "alice")
    bob = api.user(admin, "bob")
    tok = api.client.post("/api/v1/tokens", json={"name": "laptop"}, headers=alice).json()
    assert api.client.get("/api/v1/tokens", headers=bob).json() == []
    assert api.client.delete(f"/api/v1/tokens/{tok['id']}", headers=bob).status_code == 404
    assert api.client.delete(f"/api/v1/tokens/{tok['id']}", headers=admin).status_code == 404  # not even an admin
    assert api.client.get("/api/v1/me", headers=_bearer(tok["token"])).status_code == 200
    listed = api.client.get("/api/v1/tokens", headers=alice).json()
    assert [(t["name"], t["revoked"]) for t in listed] == [("laptop", False)]
    assert api.client.delete(f"/api/v1/tokens/{tok['id']}", headers=alice).json()["revoked"] is True
    assert api.client.get("/api/v1/me", headers=_bearer(tok["token"])).status_code == 401


def test_login_is_rate_limited_per_user_with_retry_after(api, admin):
    api.user(admin, "alice")
    for _ in range(5):  # CALDERA_LOGIN_MAX_FAILURES_PER_USER
        r = api.client.post("/api/v1/auth/login", json={"username": "alice", "password": "guess-guess"})
        assert r.status_code == 401
    r = api.client.post("/api/v1/auth/login", json={"username": "alice", "password": "password-123"})
    assert r.status_code == 429 and "too many failed logins" in r.json()["detail"]
    assert 1 <= int(r.headers["retry-after"]) <= 300
    # the pages' login form shares the limit and says so
    r = api.client.post(
        "/login",
        data={"username": "alice", "password": "password-123"},
        headers={"Origin": PLATFORM_ORIGIN},
        follow_redirects=False,
    )
    assert r.status_code == 429 and "Too many failed logins." in r.text and int(r.headers["retry-after"]) >= 1
    # others are not locked out by alice's attacker... unless from the same address, see below
    assert _pair(api, "admin", "admin-password")


def test_login_is_rate_limited_per_address(api):
    for i in range(20):  # CALDERA_LOGIN_MAX_FAILURES_PER_ADDRESS, spread over names that do not exist
        r = api.client.post("/api/v1/auth/login", json={"username": f"nobody{i}", "password": "guess-guess"})
        assert r.status_code == 401
    r = api.client.post("/api/v1/auth/login", json={"username": "admin", "password": "admin-password"})
    assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1


def test_unknown_names_answer_as_slowly_as_known_ones(api, admin):
    api.user(admin, "alice")

    def timed(username):
        t = time.perf_counter()
        r = api.client.post("/api/v1/auth/login", json={"username": username, "password": "wrong-password"})
        assert r.status_code == 401
        return time.perf_counter() - t

    known, unknown = [], []
    for i in range(4):
        known.append(timed("alice" if i % 2 else "admin"))
        unknown.append(timed(f"ghost{i}"))
    ratio = statistics.median(known) / statistics.median(unknown)
    assert 1 / 3 < ratio < 3, (known, unknown)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_cli_passwd_and_tokens(server, tmp_path, monkeypatch):
    monkeypatch.setenv("CALDERA_CONFIG_DIR", str(tmp_path / "cli"))
    runner = CliRunner()
    r = runner.invoke(cli, ["login", "--url", server.url, "-u", "admin", "-p", "admin-password"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(cli, ["tokens", "create", "script", "--days", "3"])
    assert r.exit_code == 0, r.output
    script_token = r.output.strip()
    assert script_token.startswith("cal_")
    r = runner.invoke(cli, ["tokens", "list"])
    assert r.exit_code == 0 and "script" in r.output and "cli@" in r.output, r.output
    listed = httpx.get(server.url + "/api/v1/tokens", headers=_bearer(script_token)).json()
    script_id = next(t["id"] for t in listed if t["name"] == "script")
    r = runner.invoke(cli, ["tokens", "revoke", str(script_id)])
    assert r.exit_code == 0, r.output
    assert httpx.get(server.url + "/api/v1/me", headers=_bearer(script_token)).status_code == 401
    r = runner.invoke(cli, ["passwd", "--current", "wrong-one-here", "--password", "brand-new-pass"])
    assert r.exit_code == 1 and "wrong current password" in r.output
    r = runner.invoke(cli, ["passwd", "--current", "admin-password", "--password", "brand-new-pass"])
    assert r.exit_code == 0, r.output
    r = httpx.post(server.url + "/api/v1/auth/login", json={"username": "admin", "password": "brand-new-pass"})
    assert r.status_code == 200
    assert runner.invoke(cli, ["ls"]).exit_code == 0  # the CLI's own personal token outlives the change
