"""The loop with a runtime that admits jobs itself (``admits_jobs``, the Kubernetes runtime): queued jobs are handed
over at once, placed nowhere by Caldera, and the runtime's reasons are shown by /why while the job waits there."""

from __future__ import annotations

import dataclasses

from caldera.core.cluster import Node
from caldera.runtime.base import Handle, Observation, Phase
from tests.conftest import api_on, make_settings, wait_for
from tests.fake_runtime import FakeRuntime
from tests.portal import browser_for
from tests.test_runs import _state, _submit, _until

CLUSTER_REASON = {
    "code": "Unschedulable",
    "message": "0/2 nodes are available",
    "details": {"source": "kube-scheduler"},
}


class AdmittingRuntime(FakeRuntime):
    admits_jobs = True

    def __init__(self, settings):
        super().__init__(settings)
        self.admitted: set[str] = set()
        self.pushed: list[dict[str, dict]] = []  # the queues each apply_queues call got, by name
        self.unreachable = False

    def apply_queues(self, queues) -> None:
        if self.unreachable:
            raise ConnectionError("cluster unreachable")
        self.pushed.append({q.name: q.quotas for q in queues})

    def observe(self, handle: Handle) -> Observation:
        if handle.job_id not in self.admitted:
            return Observation(Phase.STARTING)
        return super().observe(handle)

    def why_pending(self, handle: Handle) -> list[dict]:
        return [] if handle.job_id in self.admitted else [CLUSTER_REASON]


def test_queued_jobs_go_to_the_runtime_at_once_and_show_its_reasons(tmp_path):
    settings = make_settings(tmp_path, f"sqlite:///{tmp_path / 'caldera.db'}", run_jobs_as="server")
    rt = AdmittingRuntime(settings)
    with api_on(settings, rt) as (api, admin):
        client = api.client
        # two jobs each wanting every GPU of the fake host: Caldera's own placement would start one, queue one
        first = _submit(api, admin, name="a", command=["sleep", "0.2"], resources={"gpu": 4})
        jid = _submit(api, admin, name="b", command=["sleep", "0.2"], resources={"gpu": 4})
        _until(api, admin, jid, {"Starting"})
        assert sorted(r.job_id for r in rt.launched) == sorted([first, jid])
        assert all(r.allocations == () for r in rt.launched)

        def why() -> dict:
            client.app.state.loop.tick()
            return client.get(f"/api/v1/jobs/{jid}/why", headers=admin).json()

        # the first cycles may find the launch still in flight (observed only once it returned)
        assert wait_for(lambda: why()["pending"], what="the cluster's reasons") == [CLUSTER_REASON]
        # every view shows the reasons of a job that waits in Starting: the job page, the home page's list
        page = browser_for(client, "admin", "admin-password")
        assert (
            'id="pending"' in page.get(f"/jobs/{jid}").text
            and "0/2 nodes are available" in page.get(f"/jobs/{jid}").text
        )
        assert "0/2 nodes are available" in page.get("/partials/my-jobs").text
        rt.admitted.add(jid)
        assert _until(api, admin, jid, {"Succeeded"})["exit_code"] == 0


def test_the_runtime_gets_the_queues_when_they_change_and_again_after_a_failed_push(tmp_path):
    settings = make_settings(tmp_path, f"sqlite:///{tmp_path / 'caldera.db'}", run_jobs_as="server")
    rt = AdmittingRuntime(settings)
    with api_on(settings, rt) as (api, admin):
        client = api.client
        loop = client.app.state.loop
        loop.tick()
        loop.tick()
        assert [list(p) for p in rt.pushed] == [["default"]]  # once, not every cycle
        body = {"account": "default", "quotas": {"gpu": {"guarantee": 2}}}
        rt.unreachable = True
        assert client.put("/api/v1/queues/lab", json=body, headers=admin).status_code == 200
        loop.tick()
        assert len(rt.pushed) == 1  # the push failed; the cycle went on
        rt.unreachable = False
        loop.tick()
        assert sorted(rt.pushed[-1]) == ["default", "lab"] and rt.pushed[-1]["lab"]["gpu"].guarantee == 2
        loop.tick()
        assert len(rt.pushed) == 2


class PlacingRuntime(AdmittingRuntime):
    """Its cluster picks each job's node (as kube-scheduler does), which it reports by ``running_on``."""

    def __init__(self, settings):
        super().__init__(settings)
        self.bound: dict[str, str] = {}  # job id -> the node the cluster put it on

    def nodes(self) -> list[Node]:
        [node] = super().nodes()
        return [dataclasses.replace(node, name=name) for name in ("node-a", "node-b")]

    def running_on(self, handle: Handle) -> set[str]:
        return {self.bound[handle.job_id]} if handle.job_id in self.bound else set()


def test_drain_preempts_the_jobs_the_cluster_runs_on_the_node_though_caldera_placed_none(tmp_path):
    settings = make_settings(tmp_path, f"sqlite:///{tmp_path / 'caldera.db'}", run_jobs_as="server")
    rt = PlacingRuntime(settings)
    with api_on(settings, rt) as (api, admin):
        there = _submit(api, admin, name="there", command=["sleep", "600"], resources={"gpu": 1})
        elsewhere = _submit(api, admin, name="elsewhere", command=["sleep", "600"], resources={"gpu": 1})
        rt.admitted |= {there, elsewhere}
        rt.bound.update({there: "node-a", elsewhere: "node-b"})
        for jid in (there, elsewhere):
            assert _until(api, admin, jid, {"Running"})["allocations"] == []  # Caldera placed neither

        r = api.client.post("/api/v1/admin/nodes/node-a/drain", json={"reason": "PSU"}, headers=admin)
        assert r.status_code == 200 and r.json()["preempted"] == [there]
        assert rt.host.jobs[(there, 1)].notice.startswith("preempted: node node-a is drained by an admin: PSU\n")
        assert rt.host.jobs[(elsewhere, 1)].notice is None
        requeued = _until(api, admin, there, {"Starting"})  # handed to the cluster again as attempt 2
        assert requeued["attempt"] == 2
        assert [e["to"] for e in requeued["events"]][-3:] == ["Preempted", "Queued", "Starting"]
        assert _state(api, admin, elsewhere)["state"] == "Running"
