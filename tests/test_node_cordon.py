"""Cordon, drain and uncordon a node (admin API and the admin nodes page): stored in the database, honoured by the
scheduler (no new placements, the "why" names the node), the drained node's job preempted with the notice and
re-queued, every action in the audit log; a non-admin is refused everywhere."""

from pathlib import Path

import pytest

from tests.portal import browser_for, post_form
from tests.test_runs import _submit, _until

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def _node(api, h) -> dict:
    return api.client.get("/api/v1/nodes", headers=h).json()[0]


def test_cordon_drain_uncordon_through_the_api(api, admin):
    c = api.client
    node = _node(api, admin)["name"]
    script = "trap 'cat \"$CALDERA_PREEMPT_NOTICE\" > notice-seen; exit 0' TERM; sleep 120 & wait"
    running = _submit(api, admin, name="work", command=["sh", "-c", script], resources={"gpu": 1})
    _until(api, admin, running, {"Running"})

    r = c.post(f"/api/v1/admin/nodes/{node}/cordon", json={"reason": "fan noise"}, headers=admin)
    assert r.status_code == 200, r.text
    info = _node(api, admin)
    assert not info["schedulable"] and info["cordon"]["reason"] == "fan noise" and info["cordon"]["by"] == "admin"
    waiting = _submit(api, admin, name="waits", command=["true"], resources={"gpu": 1})
    c.app.state.loop.tick()
    j = c.get(f"/api/v1/jobs/{waiting}", headers=admin).json()
    assert j["state"] == "Queued"
    assert f"not schedulable (cordoned): {node}" in " ".join(r["message"] for r in j["pending_reasons"])
    assert c.get(f"/api/v1/jobs/{running}", headers=admin).json()["state"] == "Running"  # a cordon stops nothing

    r = c.post(f"/api/v1/admin/nodes/{node}/drain", json={"reason": "maintenance"}, headers=admin)
    assert r.status_code == 200 and r.json()["preempted"] == [running]
    j = _until(api, admin, running, {"Queued"})  # preempted with the notice, re-queued, not placed again
    reasons = [e["reason"] for e in j["events"]]
    assert "PreemptionRequested" in reasons and "NodeDrained" in reasons and "Requeued" in reasons, reasons
    workdir = Path(c.app.state.platform.settings.workspaces) / "admin" / "jobs" / running
    assert f"node {node} is drained by an admin: maintenance" in (workdir / "notice-seen").read_text()
    for _ in range(3):
        c.app.state.loop.tick()
    assert c.get(f"/api/v1/jobs/{running}", headers=admin).json()["state"] == "Queued"

    assert c.post(f"/api/v1/admin/nodes/{node}/uncordon", headers=admin).status_code == 200
    assert _until(api, admin, running, {"Running"})["attempt"] == 2
    assert _node(api, admin)["cordon"] is None
    actions = [e["action"] for e in c.get("/api/v1/audit", headers=admin).json()["entries"]]
    assert actions[:3] == ["uncordon-node", "drain-node", "cordon-node"]
    assert c.post("/api/v1/admin/nodes/nope/cordon", json={}, headers=admin).status_code == 404
    c.post(f"/api/v1/jobs/{running}/cancel", headers=admin)
    _until(api, admin, running, {"Cancelled"})


def test_a_cordon_survives_a_restart(api, admin, platform):
    """Stored, not held in memory: a new app on the same database still keeps the node out."""
    from fastapi.testclient import TestClient

    from caldera.server.app import create_app

    node = _node(api, admin)["name"]
    r = api.client.post(f"/api/v1/admin/nodes/{node}/cordon", json={"reason": "r" * 1025}, headers=admin)
    assert r.status_code == 400  # the reason has a size limit
    assert api.client.post(f"/api/v1/admin/nodes/{node}/cordon", json={"reason": "r"}, headers=admin).status_code == 200
    with TestClient(create_app(platform, run_loop=False)) as again:
        assert again.get("/api/v1/nodes", headers=admin).json()[0]["cordon"]["reason"] == "r"


def test_a_student_cannot_cordon_or_drain(api, admin):
    c = api.client
    node = c.get("/api/v1/nodes", headers=admin).json()[0]["name"]
    student = api.user(admin, "mallory", password="mallory-pass-1")
    for action in ("cordon", "drain", "uncordon"):
        r = c.post(f"/api/v1/admin/nodes/{node}/{action}", json={"reason": "mine now"}, headers=student)
        assert r.status_code == 403, (action, r.text)
    page = browser_for(c, "mallory", "mallory-pass-1")
    assert post_form(page, f"/admin/nodes/{node}/cordon", {"reason": "x", "action": "drain"}).status_code == 403
    assert post_form(page, f"/admin/nodes/{node}/uncordon", {}).status_code == 403
    assert page.get("/admin/nodes").status_code == 403
    assert c.get("/api/v1/nodes", headers=admin).json()[0]["cordon"] is None
    assert not [e for e in c.get("/api/v1/audit", headers=admin).json()["entries"] if "node" in e["action"]]


def test_admin_cordons_and_uncordons_on_the_nodes_page(api, admin):
    c = api.client
    node = c.get("/api/v1/nodes", headers=admin).json()[0]["name"]
    me = browser_for(c, "admin", "admin-password")
    assert post_form(me, f"/admin/nodes/{node}/cordon", {"reason": "new PSU", "action": "cordon"}).status_code == 303
    html = me.get("/admin/nodes").text
    assert "cordoned" in html and "new PSU" in html and "Uncordon" in html
    assert post_form(me, f"/admin/nodes/{node}/uncordon", {}).status_code == 303
    assert "new PSU" not in me.get("/admin/nodes").text
    assert post_form(me, "/admin/nodes/nope/cordon", {"reason": ""}).status_code == 404


def test_a_cordoned_node_gets_no_placement_and_the_why_says_so(api, admin):
    c = api.client
    node = _node(api, admin)["name"]
    assert c.post(f"/api/v1/admin/nodes/{node}/cordon", json={"reason": "r"}, headers=admin).status_code == 200
    waiting = _submit(api, admin, name="waits", command=["true"], resources={"gpu": 1})
    for _ in range(3):
        c.app.state.loop.tick()
    j = c.get(f"/api/v1/jobs/{waiting}", headers=admin).json()
    assert j["state"] == "Queued"
    assert f"not schedulable (cordoned): {node}" in " ".join(r["message"] for r in j["pending_reasons"])
    assert c.post(f"/api/v1/admin/nodes/{node}/uncordon", headers=admin).status_code == 200
    c.app.state.loop.tick()
    j = c.get(f"/api/v1/jobs/{waiting}", headers=admin).json()
    assert j["state"] != "Queued" or "cordoned" not in " ".join(r["message"] for r in j["pending_reasons"])
