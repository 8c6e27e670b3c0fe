"""The metrics views (cluster, node, job, GPUs held now) and GPU-hour accounting, read from Prometheus on each request
(``caldera.metrics.views``). Visibility is that of jobs: a user reads only their own jobs' series and the cluster
totals, an admin every job's; a node's view is for admins.

Without an answer from Prometheus every view still answers (200), with ``available: false`` and the ``reason``;
a job's view then still has its events."""

from __future__ import annotations

import csv
import io
import time
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, Query
from fastapi.responses import Response
from sqlalchemy.orm import Session

from caldera.core.states import JobState
from caldera.core.tenancy import Role
from caldera.db.models import User
from caldera.errors import Forbidden
from caldera.governance import requests
from caldera.metrics import prometheus, views
from caldera.metrics.query import MetricsUnavailable
from caldera.server import jobs, tenancy
from caldera.server.deps import admin_user, current_user, db_session, platform
from caldera.server.errors import Invalid, NotFound
from caldera.server.platform import Platform

router = APIRouter(prefix="/api/v1", tags=["metrics"])
SINCE = Query("1d", max_length=16, description="7d, 12h, 30m, 2w, or a UTC date 2026-12-01")
BY = Query("user", pattern="^(user|account|queue)$")
_STARTED = (JobState.STARTING.value, JobState.RUNNING.value)


def _visible_user(user: User) -> str | None:
    """Whose job series a user reads: everyone's (None) for an admin, else their own."""
    return None if user.role == Role.ADMIN.value else user.username


def _since(p: Platform, since: str, now: float) -> float:
    """The start a ``since`` names, no earlier than the series Prometheus keeps and no later than now."""
    try:
        start = views.parse_since(since, now)
    except ValueError as exc:
        raise Invalid("since", str(exc)) from None
    return min(now, max(start, now - p.settings.metrics_retention_days * views.DAY_S))


def answer(read: Callable[[], dict[str, Any] | list[Any]], key: str | None = None) -> dict[str, Any]:
    """``{"available": True, ...}`` with what ``read`` found (under ``key`` when given), or ``available: False`` and
    why Prometheus gave nothing."""
    try:
        found = read()
    except MetricsUnavailable as exc:
        return {"available": False, "reason": str(exc)}
    return {"available": True, **({key: found} if key else found)}  # type: ignore[dict-item]


@router.get("/metrics/cluster")
def cluster(
    since: str = SINCE,
    user: User = Depends(current_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
) -> dict:
    """GPUs per model allocated, computing and idle over time, average utilisation, the top idle holders; the
    waits of the queues the user may see (a queue of another account is not theirs to know of)."""
    now = time.time()
    start = _since(p, since, now)
    s = p.settings
    seen = {cfg.name for cfg in tenancy.visible_queue_configs(db, user)}

    def read() -> dict[str, Any]:
        found = views.cluster(prometheus.view_client(s), start, now, s.metrics_interval_s, _visible_user(user))
        return {**found, "queues": [q for q in found["queues"] if q["queue"] in seen]}

    return answer(read)


@router.get("/metrics/nodes/{name}")
def node(name: str, since: str = SINCE, _: User = Depends(admin_user), p: Platform = Depends(platform)) -> dict:
    """Each device's utilisation and memory over time and which job held it when (admins)."""
    if name not in {n.name for n in p.nodes()}:
        raise NotFound(f"no node {name!r}")
    now = time.time()
    start = _since(p, since, now)
    s = p.settings
    return answer(lambda: views.node(prometheus.view_client(s), name, start, now, s.metrics_interval_s))


@router.get("/metrics/jobs/{job_id}")
def job(
    job_id: str, user: User = Depends(current_user), p: Platform = Depends(platform), db: Session = Depends(db_session)
) -> dict:
    """A job's GPU, CPU and memory series over its lifetime (also once it ended, within retention), and its events
    on the same time axis."""
    row = jobs.visible(db, user, job_id)
    events = jobs.events(db, row)
    started = [e.at for e in events if e.to_state in _STARTED]
    now = time.time()
    end = row.finished_at or now
    start = max(min(started, default=row.submitted_at), end - p.settings.metrics_retention_days * views.DAY_S)
    replicas = [(a["node"], tuple(a["gpus"])) for a in row.allocations]
    s = p.settings
    out = answer(lambda: views.job(prometheus.view_client(s), row.id, replicas, start, end, s.metrics_interval_s))
    return {**out, "job": row.id, "state": row.state, "events": [jobs.event_view(e) for e in events]}


@router.get("/metrics/allocated")
def allocated(
    window_s: int = Query(600, ge=60, le=86400), user: User = Depends(current_user), p: Platform = Depends(platform)
) -> dict:
    """The GPUs held now with their mean utilisation over the last ``window_s`` (a user: their own jobs'), and per
    model the mean of all held GPUs."""
    s = p.settings
    return answer(lambda: views.allocated_now(prometheus.view_client(s), time.time(), window_s, _visible_user(user)))


def _gpu_hours(
    p: Platform, since: str, by: str, user: str | None, accounts: list[str] | None = None
) -> Callable[[], list[dict]]:
    """The read of GPU-hours (``since`` is checked now: a bad one is a 400, not a missing Prometheus)."""
    now = time.time()
    start, s = _since(p, since, now), p.settings
    return lambda: views.gpu_hours(prometheus.view_client(s), start, now, by, s.metrics_interval_s, user, accounts)


@router.get("/usage/gpu-hours")
def gpu_hours(
    since: str = Query("7d", max_length=16), by: str = BY, user: User = Depends(current_user), p=Depends(platform)
) -> dict:
    """GPU-hours allocated and used (utilisation-weighted) per UTC day and per user, account or queue: a user's own,
    an admin's of everyone. (``/usage`` is what runs now against the queues' caps.)"""
    return answer(_gpu_hours(p, since, by, _visible_user(user)), "days") | {"by": by}


def overseen_accounts(db: Session, user: User) -> list[str] | None:
    """The accounts whose use ``user`` oversees: every one (None) for an admin, else those they are an admin of;
    Forbidden for someone who oversees none."""
    if user.role == Role.ADMIN.value:
        return None
    accounts = requests.admin_accounts(db, user)
    if not accounts:
        raise Forbidden("the low-utilisation list is for admins and account admins", "NotAccountAdmin")
    return accounts


@router.get("/usage/idle-gpu-hours")
def idle_gpu_hours(
    since: str = Query("7d", max_length=16),
    by: str = Query("user", pattern="^(user|account)$"),
    user: User = Depends(current_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
) -> dict:
    """The low-utilisation list: GPU-hours allocated but idle per user or account since ``since``, the most idle
    first, from the figures of ``/usage/gpu-hours`` (admins: everyone; an account admin: their accounts' jobs)."""
    accounts = overseen_accounts(db, user)
    read = _gpu_hours(p, since, by, None, accounts)
    return answer(lambda: views.idle_gpu_hours(read(), by), "rows") | {"by": by, "since": since, "accounts": accounts}


@router.get("/usage/gpu-hours.csv")
def gpu_hours_csv(
    since: str = Query("30d", max_length=16), by: str = BY, _: User = Depends(admin_user), p=Depends(platform)
) -> Response:
    """The same for everyone as CSV (admins): day, user|account|queue, allocated and used GPU-hours."""
    read = _gpu_hours(p, since, by, None)
    try:
        rows = read()
    except MetricsUnavailable as exc:
        return Response(f"no metrics: {exc}\n", status_code=503, media_type="text/plain")
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["day", by, "allocated_gpu_hours", "used_gpu_hours"])
    for r in rows:
        writer.writerow([r["day"], _cell(r[by]), r["allocated_gpu_hours"], r["used_gpu_hours"]])
    disposition = f'attachment; filename="caldera-gpu-hours-by-{by}.csv"'
    return Response(out.getvalue(), media_type="text/csv", headers={"Content-Disposition": disposition})


def _cell(text: str) -> str:
    """A value a spreadsheet never runs as a formula (names are the platform's, but a label can be any text)."""
    return "'" + text if text[:1] in ("=", "+", "-", "@") else text
