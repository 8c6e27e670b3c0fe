"""Accounts and members managed from the admin pages (the API's rules and audit entries), and the audit log's
filters in the URL."""

import re

import pytest

from tests.portal import browser_for, post_form

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


@pytest.fixture
def me(api, admin):
    return browser_for(api.client, "admin", "admin-password")


def _members(api, admin, account: str) -> list[str]:
    users = api.client.get("/api/v1/users", headers=admin).json()
    return sorted(u["username"] for u in users if account in u["accounts"])


def test_accounts_and_members_from_the_admin_pages(api, admin, me):
    api.user(admin, "alice")
    assert post_form(me, "/admin/accounts", {"name": "vision", "description": "CV lab"}).status_code == 303
    r = post_form(me, "/admin/accounts", {"name": "Not Valid!"})
    assert r.status_code == 400 and 'value="Not Valid!"' in r.text  # the API's rule; what was typed stays
    assert post_form(me, "/admin/accounts/vision/members", {"username": "alice"}).status_code == 303
    assert _members(api, admin, "vision") == ["alice"]
    html = me.get("/admin/accounts").text
    row = html[html.index('data-account="vision"') :]
    assert "CV lab" in row and 'data-member="alice"' in row[: row.index("</tr>")]
    r = post_form(me, "/admin/accounts/vision/members", {"username": "nobody"})
    assert r.status_code == 400 and "nobody" in r.text
    assert post_form(me, "/admin/accounts/vision/members/alice/remove", {}).status_code == 303
    assert _members(api, admin, "vision") == []
    log = api.client.get("/api/v1/audit", headers=admin).json()["entries"]
    assert [e["action"] for e in log[:3]] == ["remove-member", "add-member", "create-account"]
    alice = browser_for(api.client, "alice", "password-123")
    assert alice.get("/admin/accounts").status_code == 403
    assert post_form(alice, "/admin/accounts", {"name": "mine"}).status_code == 403


def test_audit_log_filters_by_admin_action_and_target(api, admin, me):
    for name in ("vision", "nlp", "robotics"):
        assert api.client.post("/api/v1/accounts", json={"name": name}, headers=admin).status_code == 201
    api.user(admin, "alice")
    assert post_form(me, "/admin/accounts/nlp/members", {"username": "alice"}).status_code == 303
    html = me.get("/admin/audit?action=create-account").text
    assert re.findall(r"<td><code>([a-z-]+)</code></td>", html) == ["create-account"] * 3
    html = me.get("/admin/audit?target=nl").text
    assert re.findall(r"<td><code>([a-z-]+)</code></td>", html) == ["add-member", "create-account"]
    assert "<dt>username</dt><dd>alice</dd>" in html  # the detail as a list, not raw JSON
    assert me.get("/admin/audit?actor=alice").text.count("<tr data-entry=") == 0
    api_view = api.client.get("/api/v1/audit", params={"action": "add-member"}, headers=admin).json()
    assert api_view["total"] == 1 and api_view["entries"][0]["target"] == "nlp"
