"""A job's phase from its Job object and pods, as the watch cache holds them (plain dicts in the API's JSON form)."""

from __future__ import annotations

import json
from typing import Any

from caldera.runtime.base import Observation, Phase
from caldera.runtime.kubernetes import kueue

STOPPED_ANNOTATION = "caldera.io/stopped"  # set by runtime.stop before the pods get SIGTERM
# set by the runtime when Kueue evicted the job's Workload: {"reason": Kueue's (e.g. Preempted), "message": ...}
EVICTED_ANNOTATION = "caldera.io/evicted"
_ENDED_PODS = ("Succeeded", "Failed")


def evicted_as(reason: str) -> str:
    """The observation's reason for an attempt Kueue ended: Preempted, else Evicted (e.g. pods not ready in time);
    the platform requeues both as a new attempt."""
    return "Preempted" if reason == "Preempted" else "Evicted"


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind and c.get("status") == "True":
            return c
    return None


def exit_code(pods: list[dict[str, Any]]) -> int | None:
    """The first non-zero exit code of any pod's job container, else 0 once one terminated, else None."""
    codes = []
    for pod in pods:
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            term = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated")
            if term is not None:
                codes.append(int(term.get("exitCode", 0)))
    failed = [c for c in codes if c != 0]
    return failed[0] if failed else (0 if codes else None)


def phase_of(
    job: dict[str, Any] | None,
    pods: list[dict[str, Any]],
    replicas: int,
    stopped: bool,
    eviction: tuple[str, str] | None = None,
) -> Observation:
    """``eviction``: (reason, message) of a Kueue eviction seen on the job's Workload; the Job's annotation keeps
    it once the runtime has reacted (the Job may be Failed by then: its pods counted as failures)."""
    if job is None:
        if stopped:
            return Observation(Phase.FAILED, exit_code(pods), "Stopped", "stopped by the platform")
        return Observation(Phase.LOST, None, "JobGone", "the Kubernetes Job no longer exists")
    annotations = (job.get("metadata") or {}).get("annotations") or {}
    stopped = stopped or STOPPED_ANNOTATION in annotations
    if EVICTED_ANNOTATION in annotations:
        marked = json.loads(annotations[EVICTED_ANNOTATION])
        eviction = marked["reason"], marked["message"]
    if eviction and not stopped:
        # Kueue ended this attempt (took its quota back, or not all pods became ready): once every pod has had its
        # grace the platform requeues the job as a new attempt; until then it runs out its grace
        if all((p.get("status") or {}).get("phase") in _ENDED_PODS for p in pods):
            return Observation(Phase.FAILED, exit_code(pods), evicted_as(eviction[0]), eviction[1])
    elif _condition(job, "Complete"):
        return Observation(Phase.SUCCEEDED, 0, "ExitCode")
    elif failed := _condition(job, "Failed"):
        reason = "Stopped" if stopped else failed.get("reason") or "Failed"
        if reason == "DeadlineExceeded":
            reason = "RuntimeLimit"
        return Observation(Phase.FAILED, exit_code(pods), reason, failed.get("message") or "")
    running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
    if len(running) >= replicas:
        return Observation(Phase.RUNNING)
    return Observation(Phase.STARTING, None, "Suspended" if (job.get("spec") or {}).get("suspend") else "")


def pending_reasons(
    job: dict[str, Any] | None,
    pods: list[dict[str, Any]],
    workload: dict[str, Any] | None = None,
    events: dict[str, dict[str, Any]] | None = None,
    cluster_queue: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Why a handed-over job does not run yet, in the loop's reason form ({code, message, details}): Kueue's reasons
    from the job's Workload (kueue.workload_reasons), or, before Kueue made one, that the Job is still suspended;
    and kube-scheduler's for every pod it cannot place: the pod's latest FailedScheduling event (``events`` by pod
    name), else its PodScheduled condition, which carries the same text. ``cluster_queue``: the Workload's, for
    the GPU total's quota and use."""
    out: list[dict[str, Any]] = []
    if workload is not None:
        out += [
            {"code": r.code, "message": r.message, "details": r.details}
            for r in kueue.workload_reasons(workload, cluster_queue)
        ]
    elif job is not None and (job.get("spec") or {}).get("suspend"):
        out.append(
            {
                "code": "AwaitingAdmission",
                "message": "waiting for Kueue to admit the job in its queue",
                "details": {"source": "kueue"},
            }
        )
    for pod in pods:
        for c in (pod.get("status") or {}).get("conditions") or []:
            if c.get("type") == "PodScheduled" and c.get("status") == "False":
                name = pod["metadata"]["name"]
                event = (events or {}).get(name)
                details = {"source": "kube-scheduler", "pod": name, "reason": c.get("reason")}
                if event is not None:
                    details.update(event="FailedScheduling", count=event.get("count") or 1)
                message = (event or {}).get("message") or c.get("message") or "no node fits the pod"
                out.append({"code": "Unschedulable", "message": message[:2000], "details": details})
    return out
