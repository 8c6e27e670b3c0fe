"""Jobs Kueue evicts again and again because no node fits them (issue 23, finding 3).

Kueue admits a job on quota alone; when kube-scheduler finds no node for its pods, Kueue's pods-ready timeout
evicts it and the platform requeues it as a new attempt. Without more, that is a new attempt every timeout,
forever. Here each eviction in a row (of one job; Kueue's preemptions do not count) holds the next attempt's Job
back from Kueue for a delay that doubles with each eviction; after ``evictions_before_hold`` of them the next
attempt is held for good. Either ends as soon as the cluster's nodes have changed since the eviction (a node
added, removed, cordoned or uncordoned, relabelled, retainted or resized), and the count starts again. The history
travels in the Job's annotation, and ``why`` shows it with kube-scheduler's last Unschedulable message. A job that
ran starts its count again.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable
from typing import Any

# A held-back Job's queue-name label names this LocalQueue, which Caldera never makes (kueue.translate refuses a
# queue of this name): Kueue makes a Workload that waits, and moves it to the real queue when the label changes. No
# label would not do: Kueue's LocalQueueDefaulting (GA since v0.17) puts such a Job in a LocalQueue named "default".
HELD_QUEUE = "caldera-held-back"
EVICTIONS_ANNOTATION = "caldera.io/evictions"  # {"count", "message", "retry_at" or "held" and "nodes"}
MAX_BACKOFF_S = 3600.0
EVICTION_BACKOFF = "EvictionBackoff"  # reason codes (stable)
HELD_NO_NODE_FITS = "HeldNoNodeFits"


def carried(job: dict[str, Any] | None) -> dict[str, Any]:
    """The eviction history the Job carries ({} if none)."""
    text = ((job or {}).get("metadata") or {}).get("annotations", {}).get(EVICTIONS_ANNOTATION)
    try:
        return dict(json.loads(text)) if text else {}
    except (ValueError, TypeError):
        return {}


def after_eviction(job: dict[str, Any], message: str) -> dict[str, Any]:
    """The history once the attempt of ``job`` was evicted for pods not ready in time: one more in a row."""
    return {"count": int(carried(job).get("count", 0)) + 1, "message": message}


def hold_back(history: dict[str, Any], backoff_s: float, limit: int, nodes: str, now: float) -> dict[str, Any]:
    """The annotation of the next attempt's Job: it waits ``backoff_s`` doubled per eviction before the first,
    or, after ``limit`` evictions in a row, for good; either ends when the nodes' fingerprint is no longer the one
    at the eviction (``history["nodes"]``, else ``nodes``, now's)."""
    count = int(history["count"])
    out: dict[str, Any] = {"count": count, "message": history.get("message", ""), "nodes": history.get("nodes", nodes)}
    if count >= limit:
        out["held"] = True
    else:
        out["retry_at"] = now + min(MAX_BACKOFF_S, backoff_s * 2.0 ** (count - 1))
    return out


def due(annotation: dict[str, Any], nodes: str, now: float | None = None) -> bool:
    """Whether the held-back Job goes to Kueue now: the nodes changed, or (unless held) its backoff is over."""
    if annotation.get("nodes", nodes) != nodes:
        return True
    if annotation.get("held"):
        return False
    return float(annotation.get("retry_at", 0)) <= (time.time() if now is None else now)


def reason(annotation: dict[str, Any]) -> dict[str, Any]:
    """Why the held-back Job waits, in the loop's reason form."""
    count, unschedulable = int(annotation.get("count", 0)), str(annotation.get("message") or "")
    evicted = f"evicted {count} time{'s' if count != 1 else ''} in a row: its pods did not all start in time"
    if unschedulable:
        evicted += f"; kube-scheduler: {unschedulable}"
    details: dict[str, Any] = {"source": "caldera", "evictions": count, "unschedulable": unschedulable}
    if annotation.get("held"):
        again = "It goes to Kueue again when the cluster's nodes change (or cancel it and submit it changed)"
        message = f"held: {evicted}. {again}"
        return {"code": HELD_NO_NODE_FITS, "message": message[:2000], "details": details}
    retry_at = float(annotation.get("retry_at", 0))
    details["retry_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(retry_at))
    message = f"backing off: {evicted}. It goes to Kueue again at {details['retry_at']}"
    return {"code": EVICTION_BACKOFF, "message": message[:2000], "details": details}


def fingerprint(nodes: Iterable[dict[str, Any]]) -> str:
    """What of the cluster's nodes decides where pods fit: names, labels, taints, allocatable, cordons (not the
    status heartbeats)."""
    parts = []
    for n in nodes:
        meta, spec, status = n.get("metadata") or {}, n.get("spec") or {}, n.get("status") or {}
        parts.append(
            [
                meta.get("name"),
                meta.get("labels") or {},
                spec.get("taints") or [],
                bool(spec.get("unschedulable")),
                status.get("allocatable") or {},
            ]
        )
    parts.sort(key=lambda p: str(p[0]))
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]
