"""What a user can be told, and the text of each: English source strings that the translation catalogue (zh)
renders in the reader's language. ``gettext`` is passed in so this package imports nothing of the server."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from caldera.core.notify_events import (
    ACCOUNT_FLAG,
    APPROVAL_DECIDED,
    APPROVAL_REQUESTED,
    EVENTS,
    IDLE_FLAG,
    IDLE_WARNING,
    IMAGE_BUILD_FINISHED,
    JOB_FAILED,
    JOB_LOST,
    JOB_PREEMPTED,
    JOB_STARTED_AFTER_WAIT,
    JOB_SUCCEEDED,
    RUNTIME_LIMIT_WARNING,
)

PORTAL = "portal"
EMAIL = "email"
WEBHOOK = "webhook"
CHANNELS = (PORTAL, EMAIL, WEBHOOK)

# (subject, body): %(name)s fields come from the event's params
TEXTS: dict[str, tuple[str, str]] = {
    JOB_STARTED_AFTER_WAIT: ("Job %(job)s started", "Your job %(job)s started after waiting %(waited)s."),
    JOB_SUCCEEDED: ("Job %(job)s succeeded", "Your job %(job)s finished successfully."),
    JOB_FAILED: ("Job %(job)s failed", "Your job %(job)s failed: %(message)s"),
    JOB_PREEMPTED: ("Job %(job)s was preempted", "Your job %(job)s was preempted and is queued again."),
    JOB_LOST: ("Job %(job)s was lost", "Your job %(job)s was lost: %(message)s"),
    RUNTIME_LIMIT_WARNING: (
        "Job %(job)s reaches its runtime limit soon",
        "Your job %(job)s will be stopped at its runtime limit in %(left)s. Ask for an extension if it needs longer.",
    ),
    APPROVAL_REQUESTED: ("Request for job %(job)s", "%(requester)s asks to %(action)s job %(job)s: %(reason)s"),
    APPROVAL_DECIDED: ("Request for job %(job)s: %(decision)s", "Your request to %(action)s job %(job)s: %(decision)s"),
    IMAGE_BUILD_FINISHED: ("Image %(image)s: %(outcome)s", "The build of image %(image)s finished: %(outcome)s."),
    IDLE_WARNING: (
        "Job %(job)s is idle",
        "Your job %(job)s has not used its GPUs for %(window)s; it will be stopped in %(grace)s unless it is used.",
    ),
    IDLE_FLAG: (
        "Job %(job)s holds idle GPUs",
        "Your job %(job)s has not used its GPUs for %(window)s. It keeps running: end it if it no longer needs them, "
        "or ask for fewer GPUs next time, so that others can use them.",
    ),
    ACCOUNT_FLAG: (
        "Job %(job)s of %(user)s in account %(account)s",
        "The job %(job)s of %(user)s in account %(account)s %(flag)s %(after)s. You are told as an admin of the "
        "account.",
    ),
}
assert set(TEXTS) == set(EVENTS), "every event has its text"

# ACCOUNT_FLAG's flags (its ``flag`` parameter; each followed by a duration)
FLAG_IDLE, FLAG_LIMIT = "has held idle GPUs for", "was stopped at its runtime limit of"

# parameters whose value is a code, shown as the catalogue's word for it in the reader's language (an unknown
# value is shown as it is)
WORDS: dict[str, tuple[str, ...]] = {
    "action": ("extend", "lock"),
    "decision": ("approved", "declined"),
    "flag": (FLAG_IDLE, FLAG_LIMIT),
}

# what a user gets before choosing: everything in the portal, the end of a job and requests by e-mail too
DEFAULT_CHANNELS: dict[str, list[str]] = {
    event: [PORTAL, EMAIL] if event not in (JOB_STARTED_AFTER_WAIT, IMAGE_BUILD_FINISHED) else [PORTAL]
    for event in EVENTS
}

Gettext = Callable[[str], str]


def render(event: str, params: Mapping[str, Any], gettext: Gettext) -> tuple[str, str]:
    """Subject and body of ``event`` in the language of ``gettext``; a missing parameter shows as empty."""
    subject, body = TEXTS[event]
    values = _Defaulting({k: _word(k, str(v), gettext) for k, v in params.items()})
    return gettext(subject) % values, gettext(body) % values


def _word(name: str, value: str, gettext: Gettext) -> str:
    return gettext(value) if value in WORDS.get(name, ()) else value


class _Defaulting(dict):
    def __missing__(self, key: str) -> str:
        return ""


def channels_for(event: str, chosen: Mapping[str, Any], job_spec: Mapping[str, Any] | None) -> list[str]:
    """The channels ``event`` goes to: the user's choice for it (or the default), narrowed by the job's own
    ``notify:`` (a list of events, or false for none but the portal)."""
    picked = [c for c in chosen.get(event, DEFAULT_CHANNELS[event]) if c in CHANNELS]
    notify = (job_spec or {}).get("notify")
    if notify is None or notify is True:
        return picked
    if notify is False or (isinstance(notify, list) and event not in notify):
        return [c for c in picked if c == PORTAL]
    return picked
