"""A job's phase from its Job object and pods, as the watch cache holds them (plain dicts in the API's JSON form)."""

from __future__ import annotations

from typing import Any

from caldera.runtime.base import Observation, Phase

STOPPED_ANNOTATION = "caldera.io/stopped"  # set by runtime.stop before the pods get SIGTERM


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


def phase_of(job: dict[str, Any] | None, pods: list[dict[str, Any]], replicas: int, stopped: bool) -> Observation:
    if job is None:
        if stopped:
            return Observation(Phase.FAILED, exit_code(pods), "Stopped", "stopped by the platform")
        return Observation(Phase.LOST, None, "JobGone", "the Kubernetes Job no longer exists")
    stopped = stopped or STOPPED_ANNOTATION in ((job.get("metadata") or {}).get("annotations") or {})
    if _condition(job, "Complete"):
        return Observation(Phase.SUCCEEDED, 0, "ExitCode")
    failed = _condition(job, "Failed")
    if failed:
        reason = "Stopped" if stopped else failed.get("reason") or "Failed"
        if reason == "DeadlineExceeded":
            reason = "RuntimeLimit"
        return Observation(Phase.FAILED, exit_code(pods), reason, failed.get("message") or "")
    running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
    if len(running) >= replicas:
        return Observation(Phase.RUNNING)
    return Observation(Phase.STARTING, None, "Suspended" if (job.get("spec") or {}).get("suspend") else "")


def pending_reasons(job: dict[str, Any] | None, pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Why a handed-over job does not run yet, in the loop's reason form ({code, message, details}): Kueue has not
    admitted it (the Job is still suspended), or kube-scheduler cannot place a pod (its PodScheduled condition,
    the same text as its FailedScheduling event)."""
    out: list[dict[str, Any]] = []
    if job is not None and (job.get("spec") or {}).get("suspend"):
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
                out.append(
                    {
                        "code": "Unschedulable",
                        "message": c.get("message") or "no node fits the pod",
                        "details": {
                            "source": "kube-scheduler",
                            "pod": pod["metadata"]["name"],
                            "reason": c.get("reason"),
                        },
                    }
                )
    return out
