"""The portal's long lists (my jobs, all jobs, images, users, the audit log) through the real app with real rows:
paged, sorted and filtered by the database as the URL says, the pager and the sortable headers keeping the URL's
filters, and hand-made URLs (an unknown sort key, a negative page, a huge page size, a huge filter) clamped to a
list, never an error."""

import html
import re
from contextlib import contextmanager

import pytest
from sqlalchemy import event

from caldera.images import catalogue
from caldera.server import tenancy
from caldera.server.web import listing
from tests.portal import browser_for, post_form

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
JOB_ROW = r'<tr>\s*<td><a href="/jobs/\w+">\w+</a></td>\s*<td>([^<]*)</td>'
BAD_QUERIES = [
    "sort=password_hash", "sort=-", "sort=", "sort=name;drop", "page=-5", "page=0", "page=abc",
    "page=99999999999999999999", "size=0", "size=-3", "size=100000", "size=1e9", "name=" + "x" * 5000, "state=%00",
]  # fmt: skip


@pytest.fixture
def me(api, admin):
    return browser_for(api.client, "admin", "admin-password")


def _submit(api, headers, name, **kw) -> str:
    r = api.client.post("/api/v1/jobs", json={"name": name, "command": "true", **kw}, headers=headers)
    assert r.status_code == 201, r.text
    return r.json()["id"]


@pytest.fixture
def sixty(api, admin):
    """60 jobs of the admin's, job-00 to job-59, every third one in the queue "second", and one of alice's."""
    assert api.client.put("/api/v1/queues/second", json={"account": "default"}, headers=admin).status_code == 200
    for i in range(60):
        _submit(api, admin, f"job-{i:02d}", **({"queue": "second"} if i % 3 == 0 else {}))
    _submit(api, api.user(admin, "alice"), "alices-job")


def _names(text: str) -> list[str]:
    return re.findall(JOB_ROW, text)


def _href(text: str, rel: str) -> str | None:
    found = re.search(rf'rel="{rel}" href="([^"]*)"', text)
    return html.unescape(found.group(1)) if found else None


@contextmanager
def _sql(api):
    """The SQL statements the app sends meanwhile."""
    seen: list[str] = []
    engine = api.client.app.state.platform.engine

    def record(conn, cursor, statement, *args):
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


def test_my_jobs_are_paged_sorted_and_filtered_by_the_database(api, me, sixty):
    first = me.get("/jobs")
    assert first.status_code == 200
    assert _names(first.text) == [f"job-{i:02d}" for i in range(59, 9, -1)]  # newest first, 50 to a page
    assert "1 to 50 of 60" in first.text and "Page 1 of 2" in first.text
    assert _href(first.text, "next") == "?page=2" and _href(first.text, "prev") is None
    assert _names(me.get("/jobs?page=2").text) == [f"job-{i:02d}" for i in range(9, -1, -1)]

    with _sql(api) as seen:
        by_name = me.get("/jobs?sort=name&size=25&page=2").text
    assert _names(by_name) == [f"job-{i:02d}" for i in range(25, 50)]
    page_query = [s for s in seen if "FROM jobs" in s and "ORDER BY jobs.name" in s]
    assert page_query and "LIMIT" in page_query[0] and "OFFSET" in page_query[0]  # the database pages, not Python
    assert (
        _href(by_name, "next") == "?sort=name&size=25&page=3" and _href(by_name, "first") == "?sort=name&size=25&page=1"
    )
    header = re.search(r'<th aria-sort="ascending" data-sort="name"><a class="sort" href="([^"]*)"', by_name)
    assert header and html.unescape(header.group(1)) == "?sort=-name&size=25"  # again: the other way, from page 1
    assert 'value="25" selected' in by_name and '<input type="hidden" name="sort" value="name">' in by_name
    assert _names(me.get("/jobs?sort=-name&size=3").text) == ["job-59", "job-58", "job-57"]

    second = me.get("/jobs?queue=second&sort=name").text
    assert _names(second) == [f"job-{i:02d}" for i in range(0, 60, 3)] and "1 to 20 of 20" in second
    assert _names(me.get("/jobs?name=job-1&sort=-name").text) == [f"job-{i}" for i in range(19, 9, -1)]
    assert _names(me.get("/jobs?name=%25").text) == []  # a LIKE wildcard is a character like any other
    assert _names(me.get("/jobs?state=Running").text) == [] and "No jobs match." in me.get("/jobs?state=Running").text
    assert "alices-job" not in me.get("/jobs?size=200").text  # my jobs only, even an admin's

    rows = me.get("/partials/my-jobs?sort=name&size=25&page=2").text  # the rows HTMX refreshes keep the URL's page
    assert _names(rows) == _names(by_name)
    assert 'hx-get="/partials/my-jobs?sort=name&amp;size=25&amp;page=2"' in by_name


def test_bad_list_parameters_are_clamped_never_an_error(api, me, sixty):
    for path in ("/jobs", "/partials/my-jobs", "/admin/jobs", "/images", "/admin/users", "/admin/audit"):
        for query in BAD_QUERIES:
            r = me.get(f"{path}?{query}")
            refused = path == "/admin/jobs" and query.startswith("state=")  # a state it names, or none
            assert r.status_code == (400 if refused else 200), (path, query, r.status_code)
    assert _names(me.get("/jobs?sort=password_hash").text) == _names(me.get("/jobs").text)  # the default order
    assert "Page 1 of 2" in me.get("/jobs?page=-5").text
    assert "Page 2 of 2" in me.get("/jobs?page=99999999999999999999").text  # past the end: the last page
    assert len(_names(me.get("/jobs?size=100000").text)) == 60  # at most listing.MAX_SIZE rows
    assert len(_names(me.get("/jobs?size=0").text)) == 1
    assert listing.MAX_SIZE == 200


def test_all_jobs_page_sorts_by_user_and_keeps_filters_in_the_pager(api, admin, me, sixty):
    r = me.get("/admin/jobs?sort=-user&size=10")
    assert r.status_code == 200
    users = re.findall(r'<tr data-job="\w+">\s*<td><a[^>]*>\w+</a></td><td>[^<]*</td><td>(\w+)</td>', r.text)
    assert users[0] == "alice" and set(users[1:]) == {"admin"} and "1 to 10 of 61" in r.text
    filtered = me.get("/admin/jobs?user=admin&queue=second&sort=name&size=5&page=2").text
    assert re.findall(r"<td>(job-\d\d)</td>", filtered) == ["job-15", "job-18", "job-21", "job-24", "job-27"]
    assert _href(filtered, "next") == "?user=admin&queue=second&sort=name&size=5&page=3"
    assert 'value="admin" selected' in filtered and 'value="second" selected' in filtered
    r = me.get("/admin/jobs?user=nobody&state=Bogus")
    assert r.status_code == 400 and "no user" in r.text and "unknown state" in r.text


def test_users_page_is_paged_sorted_and_filtered(api, admin, me):
    for i in range(30):
        assert api.client.post(
            "/api/v1/users", json={"username": f"u{i:02d}", "password": "password-123"}, headers=admin
        ).status_code == 201  # fmt: skip
    assert post_form(me, "/admin/users/u07/role", {"role": "admin"}).status_code == 303
    listed = lambda q: re.findall(r'<tr data-user="(\w+)">', me.get(f"/admin/users{q}").text)  # noqa: E731
    assert listed("?size=25") == ["admin"] + [f"u{i:02d}" for i in range(24)]
    assert listed("?size=25&page=2") == [f"u{i:02d}" for i in range(24, 30)]
    assert listed("?sort=-username&size=3") == ["u29", "u28", "u27"]
    assert listed("?role=admin") == ["admin", "u07"]
    assert listed("?name=u1&sort=-username") == [f"u{i}" for i in range(19, 9, -1)]
    assert listed("?name=nobody") == [] and "No users match." in me.get("/admin/users?name=nobody").text
    assert browser_for(api.client, "u00", "password-123").get("/admin/users?page=2").status_code == 403


def test_audit_log_sorts_and_its_pager_keeps_the_filters(api, admin, me):
    for name in ("zeta", "alpha", "mid"):
        assert api.client.post("/api/v1/accounts", json={"name": name}, headers=admin).status_code == 201
    api.user(admin, "bob")
    text = me.get("/admin/audit?sort=target&action=create-account&size=2").text
    targets = re.findall(
        r'<tr data-entry="\d+">\s*<td>[^<]*</td><td>\w+</td><td><code>[^<]*</code></td><td>(\w+)</td>', text
    )
    assert targets == ["alpha", "mid"]
    assert _href(text, "next") == "?action=create-account&sort=target&size=2&page=2"
    newest = me.get("/admin/audit").text
    assert re.findall(r"<td><code>([a-z-]+)</code></td>", newest)[0] == "create-user"  # newest first by default


def test_images_are_paged_sorted_and_only_the_visible_ones(api, admin, me, platform):
    api.user(admin, "bob")
    with platform.session() as db:
        admin_user, bob_user = tenancy.get_user(db, "admin"), tenancy.get_user(db, "bob")
        for i in range(30):
            img = catalogue.new(db, admin_user, "public", f"img{i:02d}", "1", "public", "form", {})
            img.state, img.size_bytes = ("ready" if i % 2 else "failed"), i << 20
        mine = catalogue.new(db, bob_user, "user/bob", "bobs", "1", "private", "form", {})
        mine.state = "ready"
        db.commit()
    names = lambda t: re.findall(r"<td><code>[^<]*/(\w+):1</code></td>", t)  # noqa: E731
    by_size = me.get("/images?sort=-size&size=5&state=ready").text
    assert names(by_size) == ["img29", "img27", "img25", "img23", "img21"]
    assert _href(by_size, "next") == "?state=ready&sort=-size&size=5&page=2"
    assert names(me.get("/images?sort=name&size=3&page=2").text) == ["img02", "img03", "img04"]
    assert names(me.get("/images?name=img1&sort=name&visibility=public").text) == [f"img1{i}" for i in range(10)]
    bobs = browser_for(api.client, "bob", "password-123")
    seen = bobs.get("/images?size=200").text  # public ready images and his own, not the failed public builds
    assert sorted(names(seen)) == ["bobs"] + [f"img{i:02d}" for i in range(1, 30, 2)]
    assert "1 to 16 of 16" in seen
