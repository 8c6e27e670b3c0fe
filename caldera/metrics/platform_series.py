"""Series only the platform knows, exported beside its node agent's (the same scrape): per queue the jobs waiting,
the longest wait and the waits of the jobs that started lately (quantiles), and per node and model the GPUs that
are down. Computed at each scrape from what ``read`` returns (the server reads its database), so this package knows
nothing of the server."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, Metric

log = logging.getLogger(__name__)

QUANTILES = (0.5, 0.9, 0.99)
STARTED_WINDOW_S = 3600  # the wait quantiles are of the jobs that started within this window


@dataclass(frozen=True)
class QueueWaits:
    """One queue now: how long each of its waiting jobs has waited, and the waits of the jobs that started within
    STARTED_WINDOW_S (seconds, from entering the queue to starting)."""

    queue: str
    waiting: tuple[float, ...]
    started: tuple[float, ...]


@dataclass(frozen=True)
class DownGpus:
    """The GPUs of one model on one node that take no job: the node is cordoned or its runtime reports it not
    schedulable (0 on a node in service, so the series exists for every GPU the platform knows)."""

    node: str
    gpu_model: str
    down: int


def quantile(values: tuple[float, ...], q: float) -> float:
    """The nearest-rank quantile (the smallest value with at least ``q`` of them at or below it)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


class PlatformCollector:
    """A ``prometheus_client`` collector: register it on the agent's registry."""

    def __init__(self, read: Callable[[], tuple[list[QueueWaits], list[DownGpus]]]) -> None:
        self.read = read

    def collect(self) -> Iterator[Metric]:
        try:
            queues, down = self.read()
        except Exception:  # noqa: BLE001 - the database away for a moment: this scrape lacks these series, no more
            log.warning("queue and GPU state not read for the metrics", exc_info=True)
            return
        waiting = GaugeMetricFamily("caldera_queue_waiting_jobs", "jobs waiting in the queue", labels=["queue"])
        oldest = GaugeMetricFamily(
            "caldera_queue_oldest_wait_seconds", "how long the queue's longest waiting job has waited", labels=["queue"]
        )
        started = GaugeMetricFamily(
            "caldera_queue_started_jobs",
            f"jobs of the queue started in the last {STARTED_WINDOW_S} s",
            labels=["queue"],
        )
        waits = GaugeMetricFamily(
            "caldera_queue_wait_seconds",
            f"quantiles of the waits of the jobs started in the last {STARTED_WINDOW_S} s",
            labels=["queue", "quantile"],
        )
        for q in queues:
            waiting.add_metric([q.queue], len(q.waiting))
            oldest.add_metric([q.queue], max(q.waiting, default=0.0))
            started.add_metric([q.queue], len(q.started))
            for level in QUANTILES if q.started else ():
                waits.add_metric([q.queue, str(level)], quantile(q.started, level))
        gpus = GaugeMetricFamily("caldera_gpus_down", "GPUs on a node out of service", labels=["node", "gpu_model"])
        for d in down:
            gpus.add_metric([d.node, d.gpu_model], d.down)
        yield from (waiting, oldest, started, waits, gpus)
