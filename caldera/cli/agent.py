"""`caldera agent`: the node agent on a node of a cluster (one per node; on Kubernetes the DaemonSet of
docs/k8s/caldera-agent.yaml). It samples this node's GPUs through the metric source (``metrics_source``: nvml, or
dcgm to read the site's DCGM exporter) and learns which jobs hold which of them from the platform's API, with an
admin's token (CALDERA_URL, CALDERA_TOKEN). Inside `caldera up` the platform runs its own agent instead."""

from __future__ import annotations

import logging
import signal
import socket
import threading

import httpx
import typer

from caldera.cli.common import console, err
from caldera.client import ApiError, Client
from caldera.metrics.sources.base import Holding

log = logging.getLogger(__name__)
_HELD = ["Starting", "Running"]


def api_holdings(api: Client, node: str) -> list[Holding]:
    """The jobs holding GPUs (or running) on ``node``, as the platform lists them; none while it cannot be asked (the
    GPUs are still sampled, only not attributed)."""
    try:
        rows = api.jobs(all=True, state=_HELD, limit=5000)
    except (ApiError, httpx.HTTPError, ValueError) as exc:  # the platform away, or not the platform
        log.warning("the platform's jobs not read: %s", exc)
        return []
    out = []
    for job in rows:
        here = [a for a in job.get("allocations") or [] if a.get("node") == node]
        if here:
            gpus = tuple(int(g) for a in here for g in a.get("gpus", []))
            holder = (job["id"], job.get("user") or "", job["account"], job["queue"])
            out.append(Holding(*holder, gpus, job.get("started_at") or 0.0))
    return out


def agent(
    node: str | None = typer.Option(
        None, help="this node's name as the platform knows it (CALDERA_NODE_NAME, else the host name)"
    ),
    host: str = typer.Option(
        "127.0.0.1",
        help="address to expose the series on: loopback, or this node's address "
        "on the cluster network (a pod's IP) for the site's Prometheus",
    ),
    port: int | None = typer.Option(None, help="port to expose the series on (metrics_port, 8651)"),
    source: str | None = typer.Option(None, help="nvml, dcgm (metrics_dcgm_url) or fake (metrics_source)"),
) -> None:
    """Sample this node's GPUs and the platform's jobs on it every metrics_interval_s, in the Prometheus text format."""
    from pydantic import ValidationError

    from caldera.config import Settings
    from caldera.metrics import sources
    from caldera.metrics.agent import Agent

    try:
        settings = Settings(**({"metrics_source": source} if source else {}))
        api = Client(timeout=min(10.0, settings.metrics_interval_s))
    except (ValidationError, ApiError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    name = node or settings.node_name or socket.gethostname()
    try:
        metric_source = sources.create_source(settings)
    except sources.SourceUnavailable as exc:
        err.print(f"[red]no metrics:[/red] {exc}")
        raise typer.Exit(1) from None
    sampler = Agent(name, metric_source, lambda: api_holdings(api, name))
    where = port or settings.metrics_port
    try:
        server = sampler.serve(where, host)
    except OSError as exc:
        err.print(f"[red]error:[/red] cannot listen on {host}:{where}: {exc}")
        raise typer.Exit(1) from None
    sampler.start(settings.metrics_interval_s)
    console.print(f"agent for node {name} ({metric_source.name}) on http://{host}:{where}/metrics, jobs from {api.url}")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        sampler.stop()
        server.shutdown()
