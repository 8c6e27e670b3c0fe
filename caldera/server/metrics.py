"""The node agent inside ``caldera up``: the platform tells it which jobs hold which GPUs of this node (its running
jobs' allocations), and it is scraped by the Prometheus the platform starts (or a site's own)."""

from __future__ import annotations

import logging
import subprocess
import time
from collections import Counter
from pathlib import Path

from sqlalchemy import or_, select

from caldera.core.states import JobState
from caldera.db.models import Job, Queue, User
from caldera.metrics import prometheus, sources
from caldera.metrics.agent import Agent
from caldera.metrics.platform_series import STARTED_WINDOW_S, DownGpus, PlatformCollector, QueueWaits
from caldera.metrics.query import MetricsUnavailable
from caldera.metrics.sources.base import Holding
from caldera.server import cordons
from caldera.server.platform import Platform

log = logging.getLogger(__name__)

_ACTIVE = [JobState.STARTING.value, JobState.RUNNING.value]
_WAITING = [JobState.PENDING.value, JobState.QUEUED.value]


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


def queues_and_down_gpus(platform: Platform) -> tuple[list[QueueWaits], list[DownGpus]]:
    """Per queue the waits of its waiting jobs and of those started within the window (from entering the queue,
    so a requeued job's wait is its latest); per node and model the GPUs out of service (cordoned, or a node its
    runtime reports not schedulable)."""
    now = time.time()
    waiting: dict[str, list[float]] = {}
    started: dict[str, list[float]] = {}
    with platform.session() as db:
        for name in db.scalars(select(Queue.name)):
            waiting[name], started[name] = [], []
        recent = Job.started_at >= now - STARTED_WINDOW_S
        # the five columns, not the rows: a scrape meets every queued job, and a Job loads its spec and allocations
        columns = select(Job.queue, Job.state, Job.queued_at, Job.submitted_at, Job.started_at)
        for queue, state, queued_at, submitted_at, started_at in db.execute(
            columns.where(or_(Job.state.in_(_WAITING), recent))
        ):
            since = queued_at or submitted_at
            if state in _WAITING:
                waiting.setdefault(queue, []).append(max(0.0, now - since))
            elif started_at is not None:
                started.setdefault(queue, []).append(max(0.0, started_at - since))
        nodes = cordons.in_service(db, platform.nodes())
    queues = [QueueWaits(q, tuple(waiting.get(q, ())), tuple(started.get(q, ()))) for q in sorted(waiting | started)]
    down = [
        DownGpus(n.name, model, 0 if n.schedulable else count)
        for n in nodes
        for model, count in sorted(Counter(d.model for d in n.gpus).items())
    ]
    return queues, down


def platform_agent(platform: Platform, node: str, source: sources.MetricSource) -> Agent:
    """The agent of ``caldera up``: this node's GPUs and jobs, and the series only the platform knows (queues, GPUs
    down) in the same scrape."""
    agent = Agent(node, source, lambda: holdings(platform, node))
    agent.registry.register(PlatformCollector(lambda: queues_and_down_gpus(platform)))
    return agent


def start(platform: Platform) -> tuple[Agent | None, subprocess.Popen | None, str]:
    """Starts the agent and Prometheus; returns them and a line saying what runs (or why not)."""
    s = platform.settings
    node = s.node_name or platform.nodes()[0].name
    try:
        source = sources.create_source(s)
    except sources.SourceUnavailable as exc:
        return None, None, f"no metrics: {exc}"
    agent = platform_agent(platform, node, source)
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
