"""My running jobs' GPU utilisation on the home page's cards, read from Prometheus (caldera/metrics/query.py) with
a shorter time box than other readers: the home page answers at once even when Prometheus hangs, and says then
that there is no figure rather than waiting for one."""

from __future__ import annotations

from collections.abc import Sequence

from caldera.config import Settings
from caldera.core.states import JobState
from caldera.db.models import Job
from caldera.metrics import prometheus
from caldera.metrics.query import MetricsUnavailable, Prometheus
from caldera.server.jobs import total_gpus

TIMEOUT_S = 0.5  # at most this much of a home page's time goes to Prometheus
WINDOW_S = 60  # the mean over the last minute: several of the agent's samples


def running_jobs_use(settings: Settings, jobs: Sequence[Job]) -> dict[str, float] | None:
    """Per running job of ``jobs`` that holds GPUs and has samples: the mean utilisation of its GPUs over the last
    minute, in percent. None: Prometheus did not answer (none runs, or it is down or slow)."""
    running = {j.id for j in jobs if j.state == JobState.RUNNING.value and total_gpus(j) > 0}
    if not running:
        return {}
    client = Prometheus(prometheus.url(settings), min(settings.prometheus_timeout_s, TIMEOUT_S))
    try:
        found = client.job_gpu_utilisation(WINDOW_S)
    except MetricsUnavailable:
        return None
    per_job: dict[str, list[float]] = {}
    for gpu in found:
        if gpu.job in running:
            per_job.setdefault(gpu.job, []).append(gpu.mean_percent)
    return {job: sum(means) / len(means) for job, means in per_job.items()}
