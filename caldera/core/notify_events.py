"""The things a user can be told about (docs/governance.md): named here so a job's ``notify:`` (core.spec) and the
notification package (caldera.notify) share one list."""

from __future__ import annotations

from typing import Literal

JOB_STARTED_AFTER_WAIT = "job_started_after_wait"
JOB_SUCCEEDED = "job_succeeded"
JOB_FAILED = "job_failed"
JOB_PREEMPTED = "job_preempted"
JOB_LOST = "job_lost"
RUNTIME_LIMIT_WARNING = "runtime_limit_warning"
APPROVAL_REQUESTED = "approval_requested"
APPROVAL_DECIDED = "approval_decided"
IMAGE_BUILD_FINISHED = "image_build_finished"
IDLE_WARNING = "idle_warning"
IDLE_FLAG = "idle_flag"  # a job whose queue only tells: it is not stopped
ACCOUNT_FLAG = "account_flag"  # to an account's admins: one of its jobs was flagged idle or hit its runtime limit

NotifyEvent = Literal[
    "job_started_after_wait",
    "job_succeeded",
    "job_failed",
    "job_preempted",
    "job_lost",
    "runtime_limit_warning",
    "approval_requested",
    "approval_decided",
    "image_build_finished",
    "idle_warning",
    "idle_flag",
    "account_flag",
]
EVENTS: tuple[str, ...] = NotifyEvent.__args__  # type: ignore[attr-defined]
