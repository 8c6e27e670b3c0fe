"""Admin pages through the real app: the audit log of admin actions (written by the API's admin routes and the
pages, newest first, paged), password reset of another user, everyone's jobs with filters. Admins only."""

import re

import pytest

from tests.portal import browser_for, post_form

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


@pytest.fixture
def me(api, admin):
    return browser_for(api.client, "admin", "admin-password")


def _audit(api, admin, **params) -> dict:
    r = api.client.get("/api/v1/audit", params=params, headers=admin)
    assert r.status_code == 200, r.text
    return r.json()


def test_admin_actions_are_audited_newest_first_without_secrets(api, admin, me):
    c = api.client
    assert c.post("/api/v1/accounts", json={"name": "vision"}, headers=admin).status_code == 201
    api.user(admin, "alice", password="first-secret-pw")
    assert c.post("/api/v1/accounts/vision/members", json={"username": "alice"}, headers=admin).status_code == 201
    assert c.put("/api/v1/queues/vq", json={"account": "vision", "weight": 2}, headers=admin).status_code == 200
    bad = c.put("/api/v1/queues/vq", json={"account": "vision", "quotas": {"gpu": {"guarantee": 99}}}, headers=admin)
    assert bad.status_code == 400  # refused: no entry
    assert c.put("/api/v1/queues/vq/grants/alice", json={"max_priority": "high"}, headers=admin).status_code == 200
    r = c.put("/api/v1/users/alice/password", json={"password": "second-secret-pw"}, headers=admin)
    assert r.status_code == 200
    assert post_form(me, "/admin/users/alice/role", {"role": "admin"}).status_code == 303
    assert post_form(me, "/admin/users/alice/active", {"active": "false"}).status_code == 303

    log = _audit(api, admin)
    got = [(e["actor"], e["action"], e["target"]) for e in log["entries"]]
    assert got == [
        ("admin", "disable-user", "alice"), ("admin", "set-role", "alice"), ("admin", "reset-password", "alice"),
        ("admin", "grant-priority", "vq"), ("admin", "put-queue", "vq"), ("admin", "add-member", "vision"),
        ("admin", "create-user", "alice"), ("admin", "create-account", "vision"),
    ]  # fmt: skip
    assert log["entries"][4]["detail"] == {"account": "vision", "weight": 2}
    assert "secret-pw" not in str(log)
    html = me.get("/admin/audit").text
    assert [m for m in re.findall(r"<td><code>([a-z-]+)</code></td>", html)][:2] == ["disable-user", "set-role"]


def test_audit_log_is_paged_and_for_admins_only(api, admin, me):
    for i in range(55):
        assert api.client.post("/api/v1/accounts", json={"name": f"a{i:02d}"}, headers=admin).status_code == 201
    assert _audit(api, admin, limit=5, offset=50)["total"] == 55
    first = me.get("/admin/audit").text
    rows = re.findall(r"<td>(a\d\d)</td>", first)
    assert len(rows) == 50 and rows[0] == "a54" and rows[-1] == "a05"
    assert 'rel="next" href="?page=2"' in first and 'rel="prev"' not in first
    second = me.get("/admin/audit?page=2").text
    assert re.findall(r"<td>(a\d\d)</td>", second) == ["a04", "a03", "a02", "a01", "a00"]
    assert 'rel="prev" href="?page=1"' in second and 'rel="next"' not in second
    bob = api.user(admin, "bob")
    assert api.client.get("/api/v1/audit", headers=bob).status_code == 403
    assert browser_for(api.client, "bob", "password-123").get("/admin/audit").status_code == 403


def test_admin_resets_another_users_password(api, admin, me):
    api.user(admin, "alice")
    alice = browser_for(api.client, "alice", "password-123")
    assert post_form(alice, "/admin/users/admin/password", {"password": "owned-owned-1"}).status_code == 403
    r = post_form(me, "/admin/users/alice/password", {"password": "short"})
    assert r.status_code == 400 and "at least 8 characters" in r.text
    assert post_form(me, "/admin/users/alice/password", {"password": "a-new-password"}).status_code == 303
    assert alice.get("/", follow_redirects=False).status_code == 303  # her logins ended
    r = api.client.post("/api/v1/auth/login", json={"username": "alice", "password": "password-123"})
    assert r.status_code == 401
    api.login("alice", "a-new-password")
    users = me.get("/admin/users").text
    assert 'action="/admin/users/alice/password"' in users and 'action="/admin/users/admin/password"' not in users
    r = post_form(me, "/admin/users/admin/password", {"password": "another-password"})
    assert r.status_code == 400 and "current password" in r.text  # one's own needs the current one (the API's rule)
    assert post_form(me, "/admin/users/nobody/password", {"password": "another-password"}).status_code == 404


def test_all_jobs_with_filters(api, admin, me):
    alice = api.user(admin, "alice")
    assert api.client.put("/api/v1/queues/second", json={"account": "default"}, headers=admin).status_code == 200

    def submit(headers, name, **kw):
        r = api.client.post("/api/v1/jobs", json={"name": name, "command": "true", **kw}, headers=headers)
        assert r.status_code == 201, r.text
        return r.json()["id"]

    a1, a2 = submit(alice, "a-one"), submit(alice, "a-two", queue="second")
    m1 = submit(admin, "m-one")
    assert api.client.post(f"/api/v1/jobs/{a1}/cancel", headers=alice).status_code == 200

    def listed(query: str) -> list[str]:
        r = me.get(f"/admin/jobs{query}")
        assert r.status_code == 200, r.text
        return re.findall(r'<tr data-job="(\w+)">', r.text)

    assert listed("") == [m1, a2, a1]
    assert listed("?user=alice") == [a2, a1]
    assert listed("?user=alice&state=Cancelled") == [a1]
    assert listed("?queue=second") == [a2]
    assert listed("?user=admin&queue=second") == []
    r = me.get("/admin/jobs?user=nobody&state=Bogus")
    assert r.status_code == 400 and "no user" in r.text and "unknown state" in r.text
    assert 'value="alice" selected' in me.get("/admin/jobs?user=alice").text  # the filter stays chosen
    assert browser_for(api.client, "alice", "password-123").get("/admin/jobs").status_code == 403
