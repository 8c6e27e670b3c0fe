"""The metrics views' pages: the cluster, a node (admins), GPUs idle now. The charts are drawn in the browser from the
API's JSON (static/metrics_charts.js); the idle page is rendered here from the API's own functions."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from caldera.server import api_metrics
from caldera.server.deps import db_session, platform
from caldera.server.web import overview
from caldera.server.web.render import page
from caldera.server.web.session import PageNotFound, page_admin, page_user

router = APIRouter(include_in_schema=False)
RANGES = ("1h", "1d", "7d", "30d")
HELD_WINDOW_S = 600


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
