"""The metrics views' pages: the cluster, a node (admins), GPUs idle now, the low-utilisation list (admins and
account admins). The charts are drawn in the browser from the API's JSON (static/metrics_charts.js); the tables of
the idle and low-utilisation pages are rendered here from the API's own functions."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from caldera.errors import Forbidden
from caldera.server import api_metrics
from caldera.server.deps import db_session, platform
from caldera.server.web import overview
from caldera.server.web.render import page
from caldera.server.web.session import PageForbidden, PageNotFound, page_admin, page_user

router = APIRouter(include_in_schema=False)
RANGES = ("1h", "1d", "7d", "30d")
HELD_WINDOW_S = 600
PERIODS = ("7d", "30d")  # the low-utilisation list's


def _range(since: str) -> str:
    return since if since in RANGES else "1d"


@router.get("/cluster")
def cluster(request: Request, since: str = "1d", user=Depends(page_user)):
    return page(request, "cluster.html", user=user, since=_range(since), choices=RANGES)


@router.get("/admin/nodes/{name}/metrics")
def node(request: Request, name: str, since: str = "1d", admin=Depends(page_admin), p=Depends(platform)):
    if name not in {n.name for n in p.nodes()}:
        raise PageNotFound()
    return page(request, "node_metrics.html", user=admin, node=name, since=_range(since), choices=RANGES)


@router.get("/idle")
def idle(request: Request, user=Depends(page_user), p=Depends(platform), db=Depends(db_session)):
    """Free GPUs per model and node, what each of my queues starts at once, and how busy the held GPUs are."""
    nodes = overview.nodes_now(p, db, user)
    queues = [{**q, "largest_now": overview.largest_now(nodes, q)} for q in overview.my_queues(db, user)]
    held = api_metrics.allocated(window_s=HELD_WINDOW_S, user=user, p=p)
    return page(request, "idle.html", user=user, nodes=nodes, queues=queues, gpus=overview.free_gpus(nodes), held=held)


@router.get("/low-utilisation")
def low_utilisation(
    request: Request, since: str = "7d", by: str = "user", user=Depends(page_user), p=Depends(platform),
    db=Depends(db_session),
):  # fmt: skip
    """GPU-hours allocated but idle per user or account over 7 or 30 days, the most idle first."""
    since, by = since if since in PERIODS else PERIODS[0], by if by in ("user", "account") else "user"
    try:
        found = api_metrics.idle_gpu_hours(since=since, by=by, user=user, p=p, db=db)
    except Forbidden:
        raise PageForbidden() from None
    return page(request, "low_utilisation.html", user=user, found=found, since=since, by=by, periods=PERIODS)
