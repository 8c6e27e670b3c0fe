"""The portal's pages through the real app: login and its cookies, the home page, the job forms with the API's
errors next to their fields, permissions (another user's job is not there, admin pages refuse users), CSRF."""

import re

import pytest

from tests.portal import browser_for, field_errors, post_form

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


@pytest.fixture
def me(api, admin):
    """The admin logged in through the login form."""
    return browser_for(api.client, "admin", "admin-password")


def test_login_cookies_csp_and_errors(api):
    c = api.client
    r = c.get("/login")
    assert r.status_code == 200 and 'name="csrf_token"' in r.text
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
    assert not re.search(r"<script(?![^>]*\bsrc=)", r.text)  # no inline script anywhere
    assert "httponly" in r.headers["set-cookie"].lower()  # the CSRF cookie is not readable by scripts either

    assert c.post("/login", data={"username": "admin", "password": "admin-password"}).status_code == 403  # no token
    r = post_form(c, "/login", {"username": "admin", "password": "nope-nope-nope"})
    assert r.status_code == 401 and "Wrong username or password." in r.text
    r = post_form(c, "/login", {"username": "admin", "password": "admin-password", "next": "//evil.example/x"})
    assert r.status_code == 303 and r.headers["location"] == "/"
    cookie = r.headers["set-cookie"].lower()
    assert "caldera_session=" in cookie and "httponly" in cookie and "samesite=lax" in cookie
    assert c.get("/", follow_redirects=False).status_code == 200

    r = post_form(c, "/logout", {})
    assert r.status_code == 303
    assert c.get("/", follow_redirects=False).headers["location"] == "/login"


def test_pages_redirect_to_login_with_next(api):
    r = api.client.get("/jobs/abc", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/login?next=%2Fjobs%2Fabc"
    r = api.client.get("/admin/queue?name=gpu", follow_redirects=False)
    assert r.headers["location"] == "/login?next=%2Fadmin%2Fqueue%3Fname%3Dgpu"
    # an HTMX refresh whose session ended: the whole page goes to the login form, not a fragment of it
    hx = {"HX-Request": "true", "HX-Current-URL": "http://testserver/jobs/abc"}
    r = api.client.get("/jobs/abc/partials/status", headers=hx, follow_redirects=False)
    assert r.status_code == 204 and r.headers["hx-redirect"] == "/login?next=%2Fjobs%2Fabc"


def test_job_page_says_why_it_waits_and_has_a_log_per_rank(api, admin, me):
    body = {"name": "big", "kind": "distributed", "command": "true", "replicas": 2, "procs_per_replica": 2,
            "resources": {"gpu": 1}}  # fmt: skip
    jid = api.client.post("/api/v1/jobs", json=body, headers=admin).json()["id"]
    r = api.client.put(  # the cap comes after the submission (which it would have refused)
        "/api/v1/queues/default", json={"account": "default", "user_caps": {"max_gpus": 1}}, headers=admin
    )
    assert r.status_code == 200, r.text
    api.client.app.state.loop.tick()
    why = api.client.get(f"/api/v1/jobs/{jid}/why", headers=admin).json()["pending"]
    assert why, "the scheduler gave no reason"
    html = me.get(f"/jobs/{jid}").text
    pending = re.search(r'<ul id="pending">(.*?)</ul>', html, re.S).group(1)
    assert why[0]["code"] in pending and why[0]["message"] in pending
    ranks = re.search(r'<select id="rank">(.*?)</select>', html, re.S).group(1)
    assert re.findall(r'<option value="(\d+)"', ranks) == ["0", "1", "2", "3"]
    assert 'hx-trigger="log-state from:body, every 5s"' in html  # waiting: refreshed on each state event


def test_home_shows_my_jobs_queues_and_free_gpus(api, admin, me):
    jid = api.client.post("/api/v1/jobs", json={"name": "train", "command": "true"}, headers=admin).json()["id"]
    html = me.get("/").text
    row = re.search(rf'<tr>\s*<td><a href="/jobs/{jid}">{jid}</a></td>(.*?)</tr>', html, re.S).group(1)
    assert "train" in row and "Queued" in row and re.search(r">\d+s<", row)  # state and age
    queues = re.search(r'<table id="my-queues">(.*?)</table>', html, re.S).group(1)
    assert "<td>default</td>" in queues and "unlimited" in queues
    gpus = re.search(r'<section class="panel" id="free-gpus">(.*?)</section>', html, re.S).group(1)
    assert re.search(r'data-model="a100">.*?<span>4 / 4</span>', gpus, re.S)  # free of total, with its bar
    assert re.search(r'<progress class="usage-bar" max="4" value="4"', gpus)
    card = re.search(rf'<article class="job-card" data-job="{jid}">(.*?)</article>', html, re.S).group(1)
    assert "Queued" in card and f'action="/jobs/{jid}/cancel"' in card  # a waiting job's card, cancel one click away
    assert '<td class="largest-now">4 GPUs</td>' in queues  # the whole node, nothing else limits it
    assert jid in me.get("/partials/my-jobs").text


def test_batch_form_submits_through_the_api_rules(api, admin, me):
    good = {"name": "from-form", "command": "echo 'hi there'", "queue": "default", "gpu": "1", "cpu": "2",
            "memory_mib": "2048", "max_runtime_s": "600", "env": "A=1\nB=two words"}  # fmt: skip
    r = post_form(me, "/new/batch", good)
    assert r.status_code == 303, r.text
    jid = r.headers["location"].rsplit("/", 1)[1]
    job = api.client.get(f"/api/v1/jobs/{jid}", headers=admin).json()
    assert job["spec"]["command"] == ["echo", "hi there"] and job["spec"]["env"] == {"A": "1", "B": "two words"}
    assert job["spec"]["resources"]["gpu"] == 1 and job["spec"]["max_runtime_s"] == 600

    r = post_form(me, "/new/batch", {**good, "name": "bad name!", "cpu": "lots"})
    assert r.status_code == 400
    assert field_errors(r.text, "name") and "pattern" in field_errors(r.text, "name")[0]
    assert field_errors(r.text, "cpu")
    assert 'value="bad name!"' in r.text  # what was typed stays in the form
    r = post_form(me, "/new/batch", {**good, "gpu": "9"})  # the API's own check: more than any node has
    assert r.status_code == 400 and field_errors(r.text, "gpu")
    r = post_form(me, "/new/batch", {**good, "command": ""})
    assert r.status_code == 400 and "needs a command" in r.text
    r = post_form(me, "/new/distributed", {**good, "replicas": "2", "procs_per_replica": "2", "gpu": "1"})
    assert r.status_code == 303
    clone = me.get(f"/new/batch?clone={jid}").text  # the same job again, as a form to edit
    assert 'value="from-form"' in clone and 'value="echo &#39;hi there&#39;"' in clone
    assert ">A=1\nB=two words</textarea>" in clone
    r = post_form(me, "/new/jupyter", {"name": "nb", "queue": "default", "workdir": "projects/thesis"})
    assert r.status_code == 303
    nb = r.headers["location"].rsplit("/", 1)[1]
    assert api.client.get(f"/api/v1/jobs/{nb}", headers=admin).json()["spec"]["workdir"] == "projects/thesis"
    assert 'value="projects/thesis"' in me.get(f"/new/jupyter?clone={nb}").text
    r = post_form(me, "/new/jupyter", {"name": "nb", "queue": "default", "workdir": "../alice"})
    assert r.status_code == 400 and field_errors(r.text, "workdir")  # the API's rule, next to the field
    assert me.get("/new/other").status_code == 404
    assert job["spec"].get("notify") is None  # the form's default: my notification settings decide
    r = post_form(me, "/new/batch", {**good, "name": "quiet", "quiet": "on"})
    quiet = r.headers["location"].rsplit("/", 1)[1]
    assert api.client.get(f"/api/v1/jobs/{quiet}", headers=admin).json()["spec"]["notify"] is False
    assert re.search(r'id="quiet" name="quiet" checked', me.get(f"/new/batch?clone={quiet}").text)


def test_pickers_offer_what_the_queue_allows(api, admin, me):
    r = api.client.put(
        "/api/v1/queues/default", json={"account": "default", "user_caps": {"max_gpus": 2}}, headers=admin
    )
    assert r.status_code == 200, r.text
    html = me.get("/new/batch").text
    gpu = re.search(r'<select name="gpu" id="gpu"[^>]*>(.*?)</select>', html, re.S).group(1)
    assert re.findall(r'<option value="(\d+)"', gpu) == ["0", "1", "2"]
    assert 'data-models="a100" data-max-gpu="2" data-largest-now="2"' in html  # shown next to the GPU field
    assert '<strong id="largest-now-n">2</strong>' in html
    assert 'data-gpu="4"' not in html and 'data-gpu="1"' in html  # no preset above what the queue allows
    assert '<td class="largest-now">2 GPUs</td>' in me.get("/").text
    r = api.client.put(
        "/api/v1/queues/default", json={"account": "default", "quotas": {"gpu/a100": {"capability": 0}}}, headers=admin
    )
    assert r.status_code == 200, r.text
    assert '<td class="largest-now">0 GPUs</td>' in me.get("/").text
    html = me.get("/new/batch").text
    assert re.findall(r'<option value="(\d+)"', re.search(r'<select name="gpu".*?</select>', html, re.S).group(0)) == [
        "0"
    ]


def test_another_users_job_is_not_there(api, admin, me):
    api.user(admin, "alice")
    alice = browser_for(api.client, "alice", "password-123")
    jid = api.client.post("/api/v1/jobs", json={"name": "secret", "command": "true"}, headers=admin).json()["id"]
    for path in (f"/jobs/{jid}", f"/jobs/{jid}/partials/status"):
        r = alice.get(path)
        assert r.status_code == 404 and "secret" not in r.text
    assert post_form(alice, f"/jobs/{jid}/cancel", {}).status_code == 404
    assert alice.get(f"/new/batch?clone={jid}").status_code == 404
    assert jid not in alice.get("/").text
    page = me.get(f"/jobs/{jid}").text  # its owner sees it, its events and a cancel button
    assert "Submitted" in page and 'id="cancel"' in page and f'data-stream="/api/v1/jobs/{jid}/stream"' in page
    assert post_form(me, f"/jobs/{jid}/cancel", {}).status_code == 303
    assert api.client.get(f"/api/v1/jobs/{jid}", headers=admin).json()["state"] == "Cancelled"


def test_admin_pages_are_for_admins(api, admin, me):
    api.user(admin, "alice")
    alice = browser_for(api.client, "alice", "password-123")
    for path in ("/admin/users", "/admin/queues", "/admin/queue?name=default", "/admin/nodes"):
        assert alice.get(path).status_code == 403, path
        assert me.get(path).status_code == 200, path
    assert post_form(alice, "/admin/users", {"username": "evil", "password": "password-123"}).status_code == 403
    assert post_form(alice, "/admin/queue", {"name": "default", "account": "default"}).status_code == 403
    assert post_form(alice, "/admin/users/alice/role", {"role": "admin"}).status_code == 403
    assert "Users" not in re.search(r'<nav class="sidenav"[^>]*>(.*?)</nav>', alice.get("/").text, re.S).group(1)


def test_admin_users_create_disable_and_role(api, admin, me):
    r = post_form(me, "/admin/users", {"username": "Bad Name", "password": "password-123", "account": "default"})
    assert r.status_code == 400 and "username" in r.text
    r = post_form(me, "/admin/users", {"username": "bob", "password": "short", "account": "default"})
    assert r.status_code == 400 and "at least 8 characters" in r.text
    assert post_form(me, "/admin/users", {"username": "bob", "password": "password-123"}).status_code == 303
    bob = browser_for(api.client, "bob", "password-123")
    assert bob.get("/admin/users").status_code == 403
    assert post_form(me, "/admin/users/bob/role", {"role": "admin"}).status_code == 303
    assert bob.get("/admin/users").status_code == 200
    assert post_form(me, "/admin/users/bob/active", {"active": "false"}).status_code == 303
    assert bob.get("/", follow_redirects=False).status_code == 303  # a disabled user's session stops at once
    assert post_form(me, "/admin/users/admin/active", {"active": "false"}).status_code == 400  # not oneself
    assert post_form(me, "/admin/users/nobody/active", {"active": "false"}).status_code == 404


def test_admin_edits_a_queue_with_the_apis_validation(api, admin, me):
    base = [("name", "default"), ("account", "default"), ("weight", "2"), ("max_gpus", "3")]
    r = post_form(me, "/admin/queue", [*base, ("key", "gpu"), ("guarantee", "abc")])
    assert r.status_code == 400 and "must be a number" in r.text
    r = post_form(me, "/admin/queue", [*base, ("key", "gpu"), ("guarantee", "99")])  # more than the cluster has
    assert r.status_code == 400 and "Not saved" in r.text
    r = post_form(me, "/admin/queue", [*base, ("key", "disk"), ("capability", "1")])
    assert r.status_code == 400 and "unknown resource" in r.text
    r = post_form(me, "/admin/queue", [*base, ("key", "gpu"), ("guarantee", "1"), ("capability", "3")])
    assert r.status_code == 303
    q = api.client.get("/api/v1/queues/default", headers=admin).json()
    assert q["weight"] == 2 and q["user_caps"]["max_gpus"] == 3
    assert q["quotas"]["gpu"] == {"guarantee": 1.0, "deserved": None, "capability": 3.0}
    page = me.get("/admin/queue?name=default").text
    assert 'name="key" value="gpu"' in page and 'name="capability" value="3"' in page


def test_language_from_the_browser_and_remembered(api):
    c = api.client
    assert "登录" in c.get("/login", headers={"Accept-Language": "zh-CN,zh;q=0.9,en;q=0.5"}).text
    assert "Log in to Caldera" in c.get("/login", headers={"Accept-Language": "en-US"}).text
    r = post_form(c, "/language", {"lang": "zh", "next": "/login"})
    assert r.status_code == 303 and r.headers["location"] == "/login"
    assert '<html lang="zh">' in c.get("/login").text
    post_form(c, "/language", {"lang": "en", "next": "https://evil.example/"})
    assert "Log in to Caldera" in c.get("/login", headers={"Accept-Language": "zh"}).text


def test_forms_refuse_a_missing_or_foreign_csrf_token(api, me):
    r = me.post("/new/batch", data={"name": "x", "command": "true"}, follow_redirects=False)
    assert r.status_code == 403
    r = me.post("/new/batch", data={"name": "x", "command": "true", "csrf_token": "A" * 43}, follow_redirects=False)
    assert r.status_code == 403
    r = me.post("/new/batch", data={"name": "x", "csrf_token": "令牌"}, follow_redirects=False)
    assert r.status_code == 403


def test_personal_api_tokens(api, admin, me):
    r = post_form(me, "/tokens", {"name": "laptop", "expires_in_days": "abc"})
    assert r.status_code == 400 and "expires_in_days" in r.text
    r = post_form(me, "/tokens", {"name": "laptop", "expires_in_days": "30"})
    assert r.status_code == 201
    secret = re.search(r'<code id="new-token">([^<]+)</code>', r.text).group(1)
    assert api.client.get("/api/v1/me", headers={"Authorization": f"Bearer {secret}"}).json()["username"] == "admin"
    listing = me.get("/tokens").text
    assert "laptop" in listing and secret[:10] in listing and secret not in listing  # shown once only
    token_id = re.search(r'<tr data-token="(\d+)">', listing).group(1)

    api.user(admin, "alice")
    alice = browser_for(api.client, "alice", "password-123")
    assert post_form(alice, f"/tokens/{token_id}/revoke", {}).status_code == 404
    assert post_form(me, f"/tokens/{token_id}/revoke", {}).status_code == 303
    assert api.client.get("/api/v1/me", headers={"Authorization": f"Bearer {secret}"}).status_code == 401
    assert "revoked" in me.get("/tokens").text


def test_header_links_to_my_notifications_with_the_unread_count(api, admin, me, platform):
    from caldera.core.states import JobState
    from caldera.db.models import Job
    from caldera.server.jobs import record

    html = me.get("/").text
    assert 'id="notifications-link"' in html and 'hx-get="/partials/unread"' in html
    assert "badge" not in me.get("/partials/unread").text  # nothing unread: no count
    jid = api.client.post("/api/v1/jobs", json={"name": "train", "command": "true"}, headers=admin).json()["id"]
    with platform.session() as db:
        record(db, db.get(Job, jid), JobState.FAILED, "Failed", "exit code 3")
        db.commit()
    assert re.search(r'text-bg-danger">1<span class="visually-hidden"> unread</span>', me.get("/partials/unread").text)
    assert "未读" in me.get("/partials/unread", headers={"Accept-Language": "zh"}).text
    assert post_form(me, "/notifications/read-all", {}).status_code == 303
    assert "badge" not in me.get("/partials/unread").text
