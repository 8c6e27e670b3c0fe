"""Switching between one's accounts through the real app: the default account is where jobs that name none are
charged and where the new-job form starts; only accounts one belongs to."""

import re

import pytest

from tests.portal import browser_for, post_form

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def test_switch_the_default_account(api, admin):
    c = api.client
    for name in ("vision", "nlp"):
        assert c.post("/api/v1/accounts", json={"name": name}, headers=admin).status_code == 201
    assert c.put("/api/v1/queues/vq", json={"account": "vision"}, headers=admin).status_code == 200  # a second one
    alice_h = api.user(admin, "alice", accounts=["default", "vision"])
    alice = browser_for(c, "alice", "password-123")

    page = alice.get("/accounts").text
    assert re.search(r'<tr data-account="default">.*?<strong class="current">', page, re.S)
    assert re.findall(r'<tr data-account="(\w+)">', page) == ["default", "vision"]  # not nlp
    switcher = re.search(r'id="current-account" title="Switch account">(.*?)</a>', page, re.S).group(1)
    assert re.search(r"</span> default <i", switcher)  # the header's account switcher names the current one
    assert re.search(r'<option value="default"[^>]*selected', alice.get("/new/batch").text)

    assert post_form(alice, "/accounts/default", {"account": "vision"}).status_code == 303
    assert c.get("/api/v1/me", headers=alice_h).json()["default_account"] == "vision"
    form = alice.get("/new/batch").text  # in the account's default queue (made with the account), not vq
    assert re.findall(r'<option value="(\w+)"[^>]*selected>\w+ \(', form) == ["vision"]
    r = c.post("/api/v1/jobs", json={"name": "x", "command": "true"}, headers=alice_h)
    assert r.status_code == 201 and (r.json()["account"], r.json()["queue"]) == ("vision", "vision")

    r = post_form(alice, "/accounts/default", {"account": "nlp"})  # not hers
    assert r.status_code == 400 and "not a member of account" in r.text
    assert post_form(alice, "/accounts/default", {"account": "n" * 65}).status_code == 400
    assert c.get("/api/v1/me", headers=alice_h).json()["default_account"] == "vision"
    assert alice.post("/accounts/default", data={"account": "default"}, follow_redirects=False).status_code == 403
