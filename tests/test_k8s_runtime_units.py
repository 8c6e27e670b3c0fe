"""The Kubernetes runtime without a cluster: phases from Job and pod status as the watch delivers them, node
quantities, and a clear launch error when the API server cannot be reached."""

from __future__ import annotations

from pathlib import Path

import pytest

from caldera.config import Settings
from caldera.core.spec import JobSpec
from caldera.runtime.base import LaunchError, LaunchRequest, Phase
from caldera.runtime.kubernetes.runtime import KubernetesRuntime, _cpu, _mib
from caldera.runtime.kubernetes.settings import KubernetesSettings
from caldera.runtime.kubernetes.status import STOPPED_ANNOTATION, phase_of

pytest.importorskip("kubernetes")


def _job(conditions=(), suspend=False, annotations=None) -> dict:
    conds = [{"type": t, "status": "True", "reason": r, "message": "m"} for t, r in conditions]
    return {
        "metadata": {"annotations": annotations or {}},
        "spec": {"suspend": suspend},
        "status": {"conditions": conds},
    }


def _pod(phase: str, exit_code: int | None = None) -> dict:
    state = {"terminated": {"exitCode": exit_code}} if exit_code is not None else {"running": {}}
    return {"status": {"phase": phase, "containerStatuses": [{"name": "job", "state": state}]}}


def test_a_suspended_job_is_starting_and_says_so():
    obs = phase_of(_job(suspend=True), [], 1, stopped=False)
    assert (obs.phase, obs.reason) == (Phase.STARTING, "Suspended")


def test_running_only_when_every_replica_runs():
    assert phase_of(_job(), [_pod("Running"), _pod("Pending")], 2, False).phase is Phase.STARTING
    assert phase_of(_job(), [_pod("Running"), _pod("Running")], 2, False).phase is Phase.RUNNING


def test_complete_and_failed_jobs_carry_the_exit_code():
    done = phase_of(_job([("Complete", "")]), [_pod("Succeeded", 0)], 1, False)
    assert (done.phase, done.exit_code) == (Phase.SUCCEEDED, 0)
    failed = phase_of(_job([("Failed", "BackoffLimitExceeded")]), [_pod("Succeeded", 0), _pod("Failed", 3)], 2, False)
    assert (failed.phase, failed.exit_code, failed.reason) == (Phase.FAILED, 3, "BackoffLimitExceeded")
    limit = phase_of(_job([("Failed", "DeadlineExceeded")]), [], 1, False)
    assert limit.reason == "RuntimeLimit"


def test_a_stopped_job_fails_as_stopped_even_after_a_restart():
    stamped = _job([("Failed", "BackoffLimitExceeded")], annotations={STOPPED_ANNOTATION: "1"})
    assert phase_of(stamped, [_pod("Failed", 143)], 1, stopped=False).reason == "Stopped"
    assert phase_of(None, [], 1, stopped=True).reason == "Stopped"
    assert phase_of(None, [], 1, stopped=False).phase is Phase.LOST


def test_quantities():
    assert _cpu("3500m") == 3.5 and _cpu("16") == 16.0
    assert _mib("64Gi") == 65536 and _mib("1048576Ki") == 1024 and _mib(str(2 * 1024**3)) == 2048


def _offline_runtime(tmp_path: Path) -> KubernetesRuntime:
    """The runtime against an API server that is not there: its watch caches are filled by the test."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\nusers: [{name: u, user: {}}]\n"
    )
    rt = KubernetesRuntime(Settings(data_dir=tmp_path), KubernetesSettings(kubeconfig=kubeconfig, request_timeout_s=2))
    rt.jobs.synced.set()
    rt.pods.synced.set()
    return rt


def test_launch_against_an_unreachable_api_server_is_a_typed_error(tmp_path: Path):
    rt = _offline_runtime(tmp_path)
    try:
        req = LaunchRequest("ab12", 1, JobSpec(name="j", command=["true"]), (), tmp_path / "w")
        with pytest.raises(LaunchError) as e:
            rt.launch(req)
        assert e.value.reason == "RuntimeUnavailable"
    finally:
        rt.close()


def test_pending_reasons_name_kueue_and_the_scheduler():
    from caldera.runtime.kubernetes.status import pending_reasons

    unplaced = {
        "metadata": {"name": "caldera-ab12-1-0"},
        "status": {
            "phase": "Pending",
            "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/2 nodes: GPU"}
            ],
        },
    }
    assert [r["code"] for r in pending_reasons(_job(suspend=True), [])] == ["AwaitingAdmission"]
    (r,) = pending_reasons(_job(), [unplaced, _pod("Running")])
    assert (r["code"], r["message"], r["details"]["source"]) == ("Unschedulable", "0/2 nodes: GPU", "kube-scheduler")
    assert pending_reasons(_job(), [_pod("Running")]) == []


def test_an_attempt_kueue_evicted_ends_once_its_pods_are_gone():
    import json

    from caldera.runtime.kubernetes.status import EVICTED_ANNOTATION

    marked = {EVICTED_ANNOTATION: json.dumps({"reason": "Preempted", "message": "to accommodate a workload"})}
    # the suspension may have failed the Job (its pods counted as failures): the eviction is what ended it
    job = _job([("Failed", "BackoffLimitExceeded")], suspend=True, annotations=marked)
    assert phase_of(job, [_pod("Running")], 1, False).phase is Phase.RUNNING  # still in its grace
    ended = phase_of(job, [], 1, False)
    assert (ended.phase, ended.reason, ended.message) == (Phase.FAILED, "Preempted", "to accommodate a workload")
    seen = phase_of(_job(suspend=True), [], 1, False, eviction=("PodsReadyTimeout", "not ready in time"))
    assert (seen.phase, seen.reason) == (Phase.FAILED, "Evicted")
    assert phase_of(job, [], 1, stopped=True).reason == "Stopped"  # the platform's own stop wins


def test_kueues_reasons_replace_awaiting_admission_once_there_is_a_workload():
    from caldera.runtime.kubernetes.status import pending_reasons

    message = "couldn't assign flavors to pod set main: insufficient unused quota for nvidia.com/gpu in flavor gpu-a100"
    workload = {
        "metadata": {"name": "job-x-1"},
        "status": {
            "conditions": [{"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": message}]
        },
    }
    (r,) = pending_reasons(_job(suspend=True), [], workload)
    assert r["code"] == "KueueInsufficientQuota" and r["details"]["flavors"] == ["gpu-a100"]
    assert r["details"]["workload"] == "job-x-1"


def test_an_ended_attempt_stays_ended_once_its_job_is_deleted(tmp_path: Path):
    from caldera.runtime.base import Handle
    from caldera.runtime.kubernetes import manifests as m

    rt = _offline_runtime(tmp_path)
    try:
        job = _job([("Complete", "Completed")])
        job["metadata"].update(name="caldera-ab12-1", namespace="caldera-lab", labels={m.LABEL_JOB: "ab12"})
        job["metadata"]["labels"][m.LABEL_ATTEMPT] = "1"
        handle = Handle("ab12", 1, {"namespace": "caldera-lab", "name": "caldera-ab12-1"})
        rt.jobs._apply("ADDED", job)
        assert rt.observe(handle).phase is Phase.SUCCEEDED
        rt.jobs._apply("DELETED", job)  # ttlSecondsAfterFinished: the Job and everything it owns are gone
        assert rt.observe(handle).phase is Phase.SUCCEEDED
        # an attempt never seen ended whose Job vanished is lost, as before
        assert rt.observe(Handle("cd34", 1, {})).phase is Phase.LOST
    finally:
        rt.close()


def test_evictions_for_pods_not_ready_back_off_then_hold_until_the_nodes_change(tmp_path: Path):
    import json

    from caldera.runtime.base import Handle
    from caldera.runtime.kubernetes import evictions
    from caldera.runtime.kubernetes import manifests as m
    from caldera.runtime.kubernetes.status import EVICTED_ANNOTATION

    rt = _offline_runtime(tmp_path)
    rt.ks.eviction_backoff_s, rt.ks.evictions_before_hold = 10.0, 2
    rt.node_objs.synced.set()
    patches: list[dict] = []
    rt.batch.patch_namespaced_job = lambda name, ns, body, **kw: patches.append(body)  # type: ignore[method-assign]
    rt.batch.delete_namespaced_job = lambda name, ns, **kw: None  # type: ignore[method-assign]
    unschedulable = "0/4 nodes are available: 4 Insufficient cpu."

    def job(attempt: int, annotations: dict, queued: bool = True) -> dict:
        labels = {m.LABEL_JOB: "ab12", m.LABEL_ATTEMPT: str(attempt), m.LABEL_QUEUE: "main"}
        labels[m.KUEUE_QUEUE] = "main" if queued else evictions.HELD_QUEUE
        out = _job(suspend=True, annotations=annotations)
        out["metadata"].update(name=f"caldera-ab12-{attempt}", namespace="caldera-lab", labels=labels)
        return out

    def evicted(attempt: int, carried: dict) -> dict:
        mark = {
            "reason": "PodsReadyTimeout",
            "message": "Exceeded the PodsReady timeout",
            "unschedulable": unschedulable,
        }
        notes = {EVICTED_ANNOTATION: json.dumps(mark), evictions.EVICTIONS_ANNOTATION: json.dumps(carried)}
        return job(attempt, notes)

    try:
        rt.jobs._apply("ADDED", evicted(1, {}))
        assert rt.observe(Handle("ab12", 1, {})).reason == "Evicted"
        req = LaunchRequest("ab12", 2, JobSpec(name="j", command=["true"]), (), tmp_path / "w")
        back = rt._held_back(req)
        assert back is not None and back["count"] == 1 and not back.get("held")
        assert back["retry_at"] == pytest.approx(__import__("time").time() + 10, abs=2)

        waiting = job(2, {evictions.EVICTIONS_ANNOTATION: json.dumps(back)}, queued=False)
        rt.jobs._apply("ADDED", waiting)
        [why] = rt.why_pending(Handle("ab12", 2, {}))
        assert why["code"] == evictions.EVICTION_BACKOFF and unschedulable in why["message"]
        assert rt.observe(Handle("ab12", 2, {})).phase is Phase.STARTING and patches == []  # not yet due

        rt.jobs._apply("ADDED", evicted(3, {"count": 1}))  # the second in a row: the limit
        rt.observe(Handle("ab12", 3, {}))
        held = rt._held_back(LaunchRequest("ab12", 4, JobSpec(name="j", command=["true"]), (), tmp_path / "w"))
        assert held is not None and held["held"] and held["count"] == 2
        rt.jobs._apply("ADDED", job(4, {evictions.EVICTIONS_ANNOTATION: json.dumps(held)}, queued=False))
        [why] = rt.why_pending(Handle("ab12", 4, {}))
        assert why["code"] == evictions.HELD_NO_NODE_FITS and "nodes change" in why["message"]
        rt.observe(Handle("ab12", 4, {}))
        assert patches == []  # the nodes are as they were
        rt.node_objs._apply("ADDED", {"metadata": {"name": "gpu-node-9"}, "status": {"allocatable": {"cpu": "512"}}})
        rt.observe(Handle("ab12", 4, {}))
        [patch] = patches  # handed to Kueue again, its count started afresh
        assert patch["metadata"]["labels"] == {m.KUEUE_QUEUE: "main"}
        assert json.loads(patch["metadata"]["annotations"][evictions.EVICTIONS_ANNOTATION])["count"] == 0
    finally:
        rt.close()


def test_a_preemption_is_not_an_eviction_in_a_row(tmp_path: Path):
    import json

    from caldera.runtime.base import Handle
    from caldera.runtime.kubernetes import manifests as m
    from caldera.runtime.kubernetes.status import EVICTED_ANNOTATION

    rt = _offline_runtime(tmp_path)
    rt.batch.delete_namespaced_job = lambda name, ns, **kw: None  # type: ignore[method-assign]
    try:
        mark = json.dumps({"reason": "Preempted", "message": "to accommodate a workload"})
        job = _job(suspend=True, annotations={EVICTED_ANNOTATION: mark})
        job["metadata"].update(name="caldera-ab12-1", namespace="caldera-lab")
        job["metadata"]["labels"] = {m.LABEL_JOB: "ab12", m.LABEL_ATTEMPT: "1", m.KUEUE_QUEUE: "main"}
        rt.jobs._apply("ADDED", job)
        assert rt.observe(Handle("ab12", 1, {})).reason == "Preempted"
        assert rt._held_back(LaunchRequest("ab12", 2, JobSpec(name="j", command=["true"]), (), tmp_path / "w")) is None
    finally:
        rt.close()


def test_gpu_holders_name_calderas_jobs_and_other_pods_per_node(tmp_path: Path):
    from caldera.runtime.base import OTHER_HOLDER
    from caldera.runtime.kubernetes import manifests as m

    rt = _offline_runtime(tmp_path)
    rt.node_objs.synced.set()
    rt.bound_pods.synced.set()

    def pod(name: str, node: str | None, gpus: int, job: str | None, created: str) -> dict:
        labels = {m.LABEL_JOB: job} if job else {}
        limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
        return {
            "metadata": {"name": name, "namespace": "x", "labels": labels, "creationTimestamp": created},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": limits}}]},
        }

    try:
        for name, gpus in (("n0", "8"), ("n1", "4"), ("cpu-only", None)):
            alloc = {"cpu": "64"} | ({"nvidia.com/gpu": gpus} if gpus else {})
            rt.node_objs._apply("ADDED", {"metadata": {"name": name}, "status": {"allocatable": alloc}})
        rt.bound_pods._apply("ADDED", pod("a", "n0", 2, "ab12", "2026-01-01T00:00:01Z"))
        rt.bound_pods._apply("ADDED", pod("b", "n0", 3, None, "2026-01-01T00:00:00Z"))  # someone else's
        rt.bound_pods._apply("ADDED", pod("c", "n0", 0, None, "2026-01-01T00:00:02Z"))  # holds no GPU
        rt.bound_pods._apply("ADDED", pod("d", None, 4, "cd34", "2026-01-01T00:00:03Z"))  # not bound: holds nothing
        holders = rt.gpu_holders()
        assert holders["n0"] == [OTHER_HOLDER] * 3 + ["ab12"] * 2 + [None] * 3
        assert holders["n1"] == [None] * 4 and holders["cpu-only"] == []
    finally:
        rt.close()


def test_a_backoff_doubles_and_ends_early_when_the_nodes_change():
    from caldera.runtime.kubernetes import evictions

    waits = [evictions.hold_back({"count": n}, 30, 5, "fp", 1000.0)["retry_at"] - 1000.0 for n in (1, 2, 3, 4)]
    assert waits == [30, 60, 120, 240]
    assert evictions.hold_back({"count": 20}, 30, 50, "fp", 0.0)["retry_at"] == evictions.MAX_BACKOFF_S
    back = evictions.hold_back({"count": 1, "nodes": "at-eviction"}, 30, 5, "now", 1000.0)
    assert back["nodes"] == "at-eviction"  # the nodes as they were when it was evicted
    assert evictions.due(back, "at-eviction", now=1010.0) is False
    assert evictions.due(back, "at-eviction", now=1031.0) is True
    assert evictions.due(back, "changed", now=1010.0) is True
    held = evictions.hold_back({"count": 5, "nodes": "fp"}, 30, 5, "fp", 1000.0)
    assert held["held"] and evictions.due(held, "fp", now=1e12) is False and evictions.due(held, "other") is True
