"""The decisions, as pure functions of what is known now: no clock, no database, no Prometheus.

A gap in the metrics is not idleness: a job is warned or stopped only when every GPU it holds has samples over
the whole span in question, none further apart than ``max_gap_s``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from caldera.core.governance import IdleRule

# one GPU's samples: (epoch seconds, utilisation percent), oldest first
Series = Sequence[tuple[float, float]]


class Action(str, Enum):
    NONE = "none"
    WARN = "warn"  # idle (or near its runtime limit): tell the user, stop later
    FLAG = "flag"  # idle, but this queue only tells
    CLEAR = "clear"  # a warned or flagged job is used again (or locked): forget the warning
    STOP = "stop"


@dataclass(frozen=True)
class Verdict:
    action: Action
    reason: str  # a code: IdleWarning, IdleStopped, RuntimeLimitReached, NoData, Busy...
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class JobFacts:
    """What the decisions need of a running job and what governance recorded about it."""

    id: str
    kind: str
    gpus: int
    started_at: float
    idle_warned_at: float | None = None
    idle_flagged_at: float | None = None
    locked_until: float | None = None
    limit_warned_at: float | None = None
    extended_s: float = 0.0


def _between(series: Series, start: float, end: float) -> list[tuple[float, float]]:
    return [(t, v) for t, v in series if start <= t <= end]


def covered(samples: Mapping[str, Series], gpus: int, start: float, end: float, max_gap_s: float) -> bool:
    """Whether each of the job's ``gpus`` GPUs has samples over [start, end] with no gap over ``max_gap_s``."""
    if len(samples) < gpus:
        return False
    for series in samples.values():
        times = [start, *(t for t, _ in _between(series, start, end)), end]
        if any(b - a > max_gap_s for a, b in zip(times, times[1:])):
            return False
    return True


def means(samples: Mapping[str, Series], start: float, end: float) -> dict[str, float]:
    """Per GPU, its mean utilisation over [start, end] (GPUs without a sample there are left out)."""
    out = {}
    for gpu, series in samples.items():
        values = [v for _, v in _between(series, start, end)]
        if values:
            out[gpu] = sum(values) / len(values)
    return out


def idle(job: JobFacts, rule: IdleRule, samples: Mapping[str, Series], now: float, max_gap_s: float) -> Verdict:
    """Idle detection for one running job. ``samples``: per GPU it holds, its utilisation samples (at least the
    rule's window and grace back)."""
    warned = job.idle_warned_at is not None or job.idle_flagged_at is not None
    if not rule.enabled or job.gpus == 0:
        return Verdict(Action.CLEAR if warned else Action.NONE, "Off")
    if job.locked_until is not None and now < job.locked_until:
        return Verdict(Action.CLEAR if warned else Action.NONE, "Locked", {"until": job.locked_until})
    threshold = rule.threshold_percent
    if job.idle_warned_at is not None:
        since = means(samples, job.idle_warned_at, now)
        if any(m >= threshold for m in since.values()):
            return Verdict(Action.CLEAR, "BusyAgain", {"percent": round(max(since.values()), 1)})
        if now < job.idle_warned_at + rule.grace_s:
            return Verdict(Action.NONE, "Grace", {"stop_at": job.idle_warned_at + rule.grace_s})
        if not covered(samples, job.gpus, job.idle_warned_at, now, max_gap_s):
            return Verdict(Action.NONE, "NoData")
        return Verdict(Action.STOP, "IdleStopped", _idle_params(rule, means(samples, now - rule.window_s, now)))
    start = now - rule.window_s
    if job.started_at > start:
        return Verdict(Action.NONE, "TooYoung")
    if not covered(samples, job.gpus, start, now, max_gap_s):
        return Verdict(Action.NONE, "NoData")
    window = means(samples, start, now)
    if any(m >= threshold for m in window.values()):
        return Verdict(Action.CLEAR if warned else Action.NONE, "Busy")
    if job.idle_flagged_at is not None:
        return Verdict(Action.NONE, "Flagged")
    if rule.stop:
        return Verdict(Action.WARN, "IdleWarning", _idle_params(rule, window))
    return Verdict(Action.FLAG, "IdleFlagged", _idle_params(rule, window))


def _idle_params(rule: IdleRule, window: Mapping[str, float]) -> dict[str, Any]:
    return {
        "percent": round(max(window.values(), default=0.0), 1),
        "threshold": rule.threshold_percent,
        "window_s": rule.window_s,
        "grace_s": rule.grace_s,
    }


def runtime(job: JobFacts, limit_s: float | None, warn_before_s: float, now: float) -> Verdict:
    """The runtime limit of one running job (``limit_s`` its queue's for its kind; extensions add to it)."""
    if limit_s is None:
        return Verdict(Action.NONE, "NoLimit")
    allowed = limit_s + job.extended_s
    deadline = job.started_at + allowed
    params = {"limit_s": allowed, "deadline": deadline}
    if now >= deadline:
        return Verdict(Action.STOP, "RuntimeLimitReached", params)
    if now >= deadline - warn_before_s and job.limit_warned_at is None:
        return Verdict(Action.WARN, "RuntimeLimitWarning", {**params, "left_s": deadline - now})
    return Verdict(Action.NONE, "WithinLimit", params)
