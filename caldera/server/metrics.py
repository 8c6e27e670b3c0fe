"""The node agent inside ``caldera up``: the platform tells it which jobs hold which GPUs of this node (its running
jobs' allocations), and it is scraped by the Prometheus the platform starts (or a site's own)."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

from sqlalchemy import select

from caldera.core.states import JobState
from caldera.db.models import Job, User
from caldera.metrics import prometheus, sources
from caldera.metrics.agent import Agent
from caldera.metrics.query import MetricsUnavailable
from caldera.metrics.sources.base import Holding
from caldera.server.platform import Platform

log = logging.getLogger(__name__)

_ACTIVE = [JobState.STARTING.value, JobState.RUNNING.value]


def holdings(platform: Platform, node: str) -> list[Holding]:
    """Running jobs' GPUs on ``node``, with the processes (process runtime) the agent sums CPU and memory over."""
    out = []
    with platform.session() as db:
        rows = db.execute(select(Job, User.username).join(User, User.id == Job.user_id).where(Job.state.in_(_ACTIVE)))
        for job, username in rows:
            gpus = tuple(g for a in job.allocations if a["node"] == node for g in a["gpus"])
            if not gpus and not any(a["node"] == node for a in job.allocations):
                continue
            pids = tuple(int(r["pid"]) for r in (job.handle or {}).get("ranks", []))
            workdir = Path(job.workdir) if job.workdir else None
            out.append(
                Holding(job.id, username, job.account, job.queue, gpus, job.started_at or 0.0, None, pids, workdir)
            )
    return out


def start(platform: Platform) -> tuple[Agent | None, subprocess.Popen | None, str]:
    """Starts the agent and Prometheus; returns them and a line saying what runs (or why not)."""
    s = platform.settings
    node = s.node_name or platform.nodes()[0].name
    try:
        source = sources.create_source(s)
    except sources.SourceUnavailable as exc:
        return None, None, f"no metrics: {exc}"
    agent = Agent(node, source, lambda: holdings(platform, node))
    try:
        agent.serve(s.metrics_port)
    except OSError as exc:  # the port is taken (another platform on this host): run without metrics, say why
        return None, None, f"no metrics: the agent cannot listen on 127.0.0.1:{s.metrics_port}: {exc}"
    agent.start(s.metrics_interval_s)
    try:
        proc = prometheus.start_local(s, [f"127.0.0.1:{s.metrics_port}"])
    except MetricsUnavailable as exc:
        return agent, None, f"metrics: agent on 127.0.0.1:{s.metrics_port} ({source.name}), no Prometheus: {exc}"
    where = prometheus.url(s) if proc is not None or s.prometheus_url else "no Prometheus installed"
    return agent, proc, f"metrics: agent on 127.0.0.1:{s.metrics_port} ({source.name}), Prometheus: {where}"
