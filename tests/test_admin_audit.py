"""Issue 21: the audit entry of every admin route, written in the change's own transaction. The admin routes are
read off the app's route table (every route that depends on ``admin_user`` and changes something), so a new one
without a call below fails here. Each is called twice: once with ``audit.record`` made to fail just after it
added its entry (the database must then be exactly as before: no change without its entry, no entry without its
change), then for real (one new entry, and the change is there)."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from caldera.db.models import AdminAudit, Base
from caldera.server import audit
from caldera.server.deps import admin_user
from tests.routes import api_routes

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
WRITES = {"POST", "PUT", "PATCH", "DELETE"}

# (method, route path) -> (the path called, its body); in the order they run (a member is added before removed)
CALLS: dict[tuple[str, str], tuple[str, dict | None]] = {
    ("POST", "/api/v1/users"): ("/api/v1/users", {"username": "zed", "password": "password-123"}),
    ("PUT", "/api/v1/users/{username}/password"): ("/api/v1/users/zed/password", {"password": "password-456"}),
    ("POST", "/api/v1/accounts"): ("/api/v1/accounts", {"name": "physics"}),
    ("POST", "/api/v1/accounts/{name}/members"): ("/api/v1/accounts/physics/members", {"username": "zed"}),
    ("PUT", "/api/v1/accounts/{name}/admins/{username}"): ("/api/v1/accounts/physics/admins/zed", {"admin": True}),
    ("PUT", "/api/v1/spaces/{space}/members/{username}"): ("/api/v1/spaces/account:physics/members/zed", {"mode": "ro"}),  # noqa: E501
    ("PATCH", "/api/v1/spaces/{space}"): ("/api/v1/spaces/account:physics", {"quota_bytes": 1_000_000}),
    ("POST", "/api/v1/spaces/{space}/reconcile"): ("/api/v1/spaces/account:physics/reconcile", None),
    ("DELETE", "/api/v1/spaces/{space}"): ("/api/v1/spaces/account:physics", None),
    ("DELETE", "/api/v1/accounts/{name}/members/{username}"): ("/api/v1/accounts/physics/members/zed", None),
    ("PUT", "/api/v1/queues/{name}"): ("/api/v1/queues/physics", {"account": "physics", "weight": 2.0}),
    ("PUT", "/api/v1/queues/{name}/grants/{username}"): ("/api/v1/queues/physics/grants/zed", {"max_priority": "high"}),
    ("DELETE", "/api/v1/queues/{name}/grants/{username}"): ("/api/v1/queues/physics/grants/zed", None),
    ("PUT", "/api/v1/images/quotas/{username}"): ("/api/v1/images/quotas/zed", {"quota_mib": 100}),
    ("POST", "/api/v1/images/environments"): ("/api/v1/images/environments", {"ref": "caldera/x:1", "python": "3.11"}),
    ("DELETE", "/api/v1/images/environments/{ref:path}"): ("/api/v1/images/environments/caldera/x:1", None),
    ("POST", "/api/v1/admin/nodes/{name}/cordon"): ("/api/v1/admin/nodes/node-0/cordon", {"reason": "fan"}),
    ("POST", "/api/v1/admin/nodes/{name}/uncordon"): ("/api/v1/admin/nodes/node-0/uncordon", None),
    ("POST", "/api/v1/admin/nodes/{name}/drain"): ("/api/v1/admin/nodes/node-0/drain", {"reason": "disk"}),
}  # fmt: skip
# admin routes that act on a running job, which this app has none of: their entries are checked where one runs
ELSEWHERE = {("POST", "/api/v1/jobs/{job_id}/requeue")}  # tests/test_job_holds.py


def _needs_admin(dependant) -> bool:
    return any(d.call is admin_user or _needs_admin(d) for d in dependant.dependencies)


def admin_writes(app) -> set[tuple[str, str]]:
    return {
        (method, route.path)
        for route in api_routes(app)
        if _needs_admin(route.dependant)
        for method in route.methods & WRITES
    }


def _database(platform) -> dict[str, list]:
    """Every row of every table, to compare before and after."""
    with platform.engine.connect() as conn:
        return {t.name: sorted(map(repr, conn.execute(select(t)).all())) for t in Base.metadata.sorted_tables}


def test_every_admin_route_writes_one_audit_entry_in_the_changes_transaction(api, admin, platform, monkeypatch):
    from fastapi.testclient import TestClient

    routes = admin_writes(api.client.app)
    assert len(routes) >= 10, routes  # the table was read
    covered = set(CALLS) | ELSEWHERE
    assert routes == covered, f"admin routes without a call here: {routes - covered}; gone: {covered - routes}"
    failing = TestClient(api.client.app, raise_server_exceptions=False)
    record = audit.record

    def record_then_fail(*args, **kwargs):
        record(*args, **kwargs)
        raise RuntimeError("injected after the audit entry was added")

    for (method, _), (path, body) in CALLS.items():
        if path.startswith("/api/v1/spaces/"):  # a space's row is made (in a transaction of its own) when first opened
            space = path.split("/")[4]
            assert api.client.get(f"/api/v1/spaces/{space}/list", headers=admin).is_success
        before = _database(platform)
        with monkeypatch.context() as m:
            m.setattr(audit, "record", record_then_fail)
            r = failing.request(method, path, json=body, headers=admin)
        assert r.status_code == 500, (method, path, r.status_code, r.text)
        assert _database(platform) == before, f"{method} {path} kept a change or an entry of a failed transaction"

        r = api.client.request(method, path, json=body, headers=admin)
        assert 200 <= r.status_code < 300, (method, path, r.text)
        after = _database(platform)
        with platform.session() as db:
            entries = db.scalars(select(AdminAudit).order_by(AdminAudit.id)).all()
        assert len(after["admin_audit"]) == len(before["admin_audit"]) + 1, (method, path)
        assert entries[-1].actor == "admin", (method, path, entries[-1].actor)
        changed = [t for t in after if t != "admin_audit" and after[t] != before[t]]
        assert changed, f"{method} {path}: an entry but no change"


def test_a_refused_admin_change_writes_no_entry(api, admin, platform):
    before = _database(platform)["admin_audit"]
    for method, path, body in (
        ("POST", "/api/v1/accounts/nowhere/members", {"username": "admin"}),
        ("PUT", "/api/v1/users/nobody/password", {"password": "password-456"}),
        ("POST", "/api/v1/admin/nodes/no-node/cordon", {"reason": "x"}),
        ("PUT", "/api/v1/queues/q", {"account": "no-account"}),
    ):
        r = api.client.request(method, path, json=body, headers=admin)
        assert 400 <= r.status_code < 500, (method, path, r.text)
    assert _database(platform)["admin_audit"] == before
