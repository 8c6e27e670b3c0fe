"""Job templates through the real app: the API under /api/v1/templates (the spec's rules, size limits, sharing
with an account, others' templates do not exist) and the pages on it (save the form, start from one, share)."""

import re

import pytest

from caldera.server import api_templates
from tests.portal import browser_for, field_errors, post_form

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)

SPEC = {"name": "train", "command": "python train.py", "resources": {"gpu": 1}, "env": {"A": "1"}}


@pytest.fixture
def people(api, admin):
    """alice and bob in account vision (and default), carol in default only."""
    assert api.client.post("/api/v1/accounts", json={"name": "vision"}, headers=admin).status_code == 201
    both = {"accounts": ["default", "vision"]}
    return {"alice": api.user(admin, "alice", **both), "bob": api.user(admin, "bob", **both),
            "carol": api.user(admin, "carol")}  # fmt: skip


def test_templates_api_rules_and_limits(api, people, monkeypatch):
    a = people["alice"]
    post = lambda body: api.client.post("/api/v1/templates", json=body, headers=a)  # noqa: E731
    r = post({"name": "t1", "spec": SPEC, "description": "my training run"})
    assert r.status_code == 201, r.text
    t = r.json()
    assert t["owner"] == "alice" and t["kind"] == "batch" and t["shared_account"] is None
    assert t["spec"]["command"] == ["python", "train.py"] and "workdir" not in t["spec"]  # as the API parses it

    r = post({"name": "t2", "spec": {**SPEC, "resources": {"gpu": -1}}})  # the spec's own rules
    assert r.status_code == 400 and r.json()["errors"][0]["field"] == "resources.gpu"
    assert post({"name": "x" * 129, "spec": SPEC}).status_code == 400
    assert post({"name": "t3", "spec": SPEC, "description": "d" * 4097}).status_code == 400
    assert post({"name": "t4", "spec": SPEC, "shared_account": "v" * 65}).status_code == 400
    huge = {**SPEC, "env": {f"V{i}": "x" * 1100 for i in range(250)}}  # within the spec's limits, not a template's
    r = post({"name": "t5", "spec": huge})
    assert r.status_code == 400 and "at most 262144 bytes" in r.text
    assert post({"name": "t1", "spec": {**SPEC, "name": "again"}}).status_code == 201  # same name: replaced
    listing = api.client.get("/api/v1/templates", headers=a).json()
    assert [(x["name"], x["spec"]["name"]) for x in listing] == [("t1", "again")]
    monkeypatch.setattr(api_templates, "MAX_TEMPLATES_PER_USER", 2)
    assert post({"name": "t6", "spec": SPEC}).status_code == 201
    r = post({"name": "t7", "spec": SPEC})
    assert r.status_code == 409 and "delete some first" in r.text


def test_sharing_with_an_account_and_nobody_else(api, people):
    a, b, c = people["alice"], people["bob"], people["carol"]
    tid = api.client.post("/api/v1/templates", json={"name": "t", "spec": SPEC}, headers=a).json()["id"]
    for who in (b, c):
        assert api.client.get(f"/api/v1/templates/{tid}", headers=who).status_code == 404
        assert api.client.get("/api/v1/templates", headers=who).json() == []
    share = lambda acc, h=a: api.client.put(f"/api/v1/templates/{tid}/share", json={"account": acc}, headers=h)  # noqa: E731
    assert share("nosuch").status_code == 400
    assert share("vision").status_code == 200
    assert api.client.get(f"/api/v1/templates/{tid}", headers=b).json()["owner"] == "alice"
    assert [t["id"] for t in api.client.get("/api/v1/templates", headers=b).json()] == [tid]
    assert api.client.get(f"/api/v1/templates/{tid}", headers=c).status_code == 404  # not in vision
    assert share(None, b).status_code == 404  # bob may use it, not change it
    assert api.client.delete(f"/api/v1/templates/{tid}", headers=b).status_code == 404
    r = api.client.put(f"/api/v1/templates/{tid}/share", json={"account": "vision"}, headers=c)
    assert r.status_code == 404
    carol_t = api.client.post("/api/v1/templates", json={"name": "c", "spec": SPEC}, headers=c).json()["id"]
    r = api.client.put(f"/api/v1/templates/{carol_t}/share", json={"account": "vision"}, headers=c)
    assert r.status_code == 400 and "not a member" in r.text  # one shares only with one's own accounts
    assert api.client.delete(f"/api/v1/templates/{tid}", headers=a).json()["deleted"] is True
    assert api.client.get(f"/api/v1/templates/{tid}", headers=b).status_code == 404


def test_pages_save_the_form_start_from_a_template_and_share_it(api, people):
    alice = browser_for(api.client, "alice", "password-123")
    form = {"name": "nb-template", "queue": "default", "gpu": "1", "cpu": "2", "memory_mib": "2048", "env": "A=1"}
    r = post_form(alice, "/new/jupyter/template", form)
    assert r.status_code == 303 and r.headers["location"] == "/templates"
    page = alice.get("/templates").text
    tid = re.search(r'<tr data-template="(\d+)">', page).group(1)
    assert f'href="/new/jupyter?template={tid}">nb-template</a>' in page
    started = alice.get(f"/new/batch?template={tid}").text  # the template's kind wins
    assert 'action="/new/jupyter"' in started and 'value="nb-template"' in started
    assert '<option value="1" selected>1</option>' in started and ">A=1</textarea>" in started
    r = post_form(alice, "/new/batch/template", {**form, "name": "no command"})  # the spec's rules, at the field
    assert r.status_code == 400 and field_errors(r.text, "name")

    bob, carol = (browser_for(api.client, u, "password-123") for u in ("bob", "carol"))
    assert bob.get(f"/new/jupyter?template={tid}").status_code == 404
    assert post_form(alice, f"/templates/{tid}/share", {"account": "vision"}).status_code == 303
    bob_page = bob.get("/templates").text
    assert "nb-template" in bob_page and f"/templates/{tid}/delete" not in bob_page  # his to use, not to change
    assert 'value="nb-template"' in bob.get(f"/new/jupyter?template={tid}").text
    assert post_form(bob, f"/templates/{tid}/delete", {}).status_code == 404
    assert carol.get(f"/new/jupyter?template={tid}").status_code == 404
    assert "nb-template" not in carol.get("/templates").text
    r = post_form(carol, f"/templates/{tid}/share", {"account": "default"})
    assert r.status_code == 404
    assert post_form(alice, f"/templates/{tid}/delete", {}).status_code == 303
    assert "No templates yet." in alice.get("/templates").text
