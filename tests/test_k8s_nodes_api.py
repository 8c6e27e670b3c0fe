"""The nodes view (API, and the admin page built from it) on a runtime whose cluster places jobs itself: who holds
each GPU comes from the runtime's gpu_holders (Kubernetes: its pod watch), not from Caldera's allocations. The
runtime here is the test platform's own, given the one method; tests/k8s/test_nodes_cluster.py runs it for real."""

from __future__ import annotations

from caldera.runtime.base import OTHER_HOLDER

BATCH = {"name": "j", "command": ["sleep", "60"], "resources": {"gpu": 1}}


def test_gpu_holders_are_shown_by_whose_they_are(api, admin, platform, monkeypatch):
    alice = api.user(admin, "alice")
    bob = api.user(admin, "bob")
    jid = api.client.post("/api/v1/jobs", json=BATCH, headers=alice).json()["id"]
    api.client.app.state.loop.tick()  # it starts: a job holding GPUs is Starting or Running
    holders = {"node-0": [OTHER_HOLDER, jid, "0123456789ab", None]}  # the last but one: an ended attempt's pod
    monkeypatch.setattr(platform.runtime, "gpu_holders", lambda: holders, raising=False)

    def shown(headers) -> list:
        [node] = [n for n in api.client.get("/api/v1/nodes", headers=headers).json() if n["name"] == "node-0"]
        return [g["job"] for g in node["gpus"]]

    assert shown(admin) == [OTHER_HOLDER, jid, "0123456789ab", None]
    assert shown(alice) == [OTHER_HOLDER, jid, "busy", None]
    assert shown(bob) == [OTHER_HOLDER, "busy", "busy", None]


def test_without_gpu_holders_the_allocations_say_it(api, admin, platform):
    assert not hasattr(platform.runtime, "gpu_holders")
    nodes = api.client.get("/api/v1/nodes", headers=admin).json()
    assert all(g["job"] is None for n in nodes for g in n["gpus"])
