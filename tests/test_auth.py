"""Tokens, roles and who sees what."""

import time

import jwt


def test_login_wrong_password(api):
    r = api.client.post("/api/v1/auth/login", json={"username": "admin", "password": "nope-nope"})
    assert r.status_code == 401


def test_refresh_token_is_not_an_access_token(api):
    pair = api.client.post("/api/v1/auth/login", json={"username": "admin", "password": "admin-password"}).json()
    assert api.client.get("/api/v1/me", headers={"Authorization": f"Bearer {pair['access_token']}"}).status_code == 200
    assert api.client.get("/api/v1/me", headers={"Authorization": f"Bearer {pair['refresh_token']}"}).status_code == 401
    # and an access token cannot refresh
    assert api.client.post("/api/v1/auth/refresh", json={"refresh_token": pair["access_token"]}).status_code == 401


def test_refresh_rotates_and_old_one_is_spent(api):
    pair = api.client.post("/api/v1/auth/login", json={"username": "admin", "password": "admin-password"}).json()
    r = api.client.post("/api/v1/auth/refresh", json={"refresh_token": pair["refresh_token"]})
    assert r.status_code == 200
    new = r.json()
    assert api.client.get("/api/v1/me", headers={"Authorization": f"Bearer {new['access_token']}"}).status_code == 200
    assert api.client.post("/api/v1/auth/refresh", json={"refresh_token": pair["refresh_token"]}).status_code == 401
    api.client.post("/api/v1/auth/logout", json={"refresh_token": new["refresh_token"]})
    assert api.client.post("/api/v1/auth/refresh", json={"refresh_token": new["refresh_token"]}).status_code == 401


def test_expired_and_forged_access_tokens(api, platform):
    now = int(time.time())
    expired = jwt.encode(
        {"sub": "1", "typ": "access", "iat": now - 100, "exp": now - 10}, platform.keys.access, algorithm="HS256"
    )
    forged = jwt.encode(
        {"sub": "1", "typ": "access", "iat": now, "exp": now + 100},
        "an attacker key, not the platform one!",
        algorithm="HS256",
    )
    signed_with_refresh_key = jwt.encode(
        {"sub": "1", "typ": "access", "iat": now, "exp": now + 100}, platform.keys.refresh, algorithm="HS256"
    )
    for tok in (expired, forged, signed_with_refresh_key):
        assert api.client.get("/api/v1/me", headers={"Authorization": f"Bearer {tok}"}).status_code == 401


def test_personal_token_lifecycle(api, admin):
    r = api.client.post("/api/v1/tokens", json={"name": "laptop"}, headers=admin)
    assert r.status_code == 201
    tok = r.json()
    assert tok["token"].startswith("cal_")
    h = {"Authorization": f"Bearer {tok['token']}"}
    assert api.client.get("/api/v1/me", headers=h).json()["username"] == "admin"
    listed = api.client.get("/api/v1/tokens", headers=admin).json()
    assert [t["name"] for t in listed] == ["laptop"] and "token" not in listed[0]
    assert api.client.delete(f"/api/v1/tokens/{tok['id']}", headers=admin).status_code == 200
    assert api.client.get("/api/v1/me", headers=h).status_code == 401


def test_tokens_are_stored_hashed(api, admin, platform):
    from caldera.db.models import ApiToken, User

    secret = api.client.post("/api/v1/tokens", json={"name": "x"}, headers=admin).json()["token"]
    with platform.session() as db:
        rows = db.query(ApiToken).all()
        assert all(secret != r.token_hash and secret[10:] not in r.token_hash for r in rows)
        assert db.query(User).filter_by(username="admin").one().password_hash.startswith("$argon2")


def test_admin_routes_check_the_role(api, admin):
    alice = api.user(admin, "alice")
    assert api.client.get("/api/v1/users", headers=alice).status_code == 403
    assert (
        api.client.post(
            "/api/v1/users", json={"username": "eve", "password": "password-123", "role": "admin"}, headers=alice
        ).status_code
        == 403
    )
    assert api.client.post("/api/v1/accounts", json={"name": "x"}, headers=alice).status_code == 403
    assert api.client.put("/api/v1/queues/default", json={"account": "default"}, headers=alice).status_code == 403
    assert api.client.get("/api/v1/users", headers=admin).status_code == 200


def test_unauthenticated_is_refused(api):
    for path in ("/api/v1/jobs", "/api/v1/me", "/api/v1/nodes", "/api/v1/queues"):
        assert api.client.get(path).status_code == 401


def test_openapi_served(api):
    doc = api.client.get("/api/v1/openapi.json").json()
    assert "/api/v1/jobs" in doc["paths"] and "/api/v1/auth/refresh" in doc["paths"]
