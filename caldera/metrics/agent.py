"""The node agent: every ``metrics_interval_s`` it samples each GPU through the metric source and each job on this
node through its cgroup or process tree, and keeps the latest values as Prometheus series (``caldera_*``) that
``prometheus_client`` serves on 127.0.0.1:``metrics_port``.

Which jobs hold which GPUs comes from ``holdings`` (a callable the caller supplies: the platform inside
``caldera up``, the platform's API under ``caldera agent``), so the agent knows nothing of the server."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from caldera.metrics.attribution import holders_of
from caldera.metrics.jobstats import JobStats, cgroup_stats, process_tree, process_tree_stats
from caldera.metrics.sources.base import GpuSample, Holding, MetricSource

log = logging.getLogger(__name__)

GPU_LABELS = ("node", "gpu", "gpu_model")
JOB_GPU_LABELS = (*GPU_LABELS, "job", "user", "account", "queue")
JOB_LABELS = ("node", "job", "user", "account", "queue")


class Agent:
    def __init__(self, node: str, source: MetricSource, holdings: Callable[[], list[Holding]]) -> None:
        self.node, self.source, self.holdings = node, source, holdings
        self.registry = CollectorRegistry()
        r = self.registry
        self.gpu_util = Gauge("caldera_gpu_utilisation_percent", "GPU utilisation", GPU_LABELS, registry=r)
        self.gpu_mem = Gauge("caldera_gpu_memory_used_bytes", "GPU memory used", GPU_LABELS, registry=r)
        self.gpu_mem_total = Gauge("caldera_gpu_memory_total_bytes", "GPU memory", GPU_LABELS, registry=r)
        self.gpu_clock = Gauge("caldera_gpu_sm_clock_mhz", "SM clock", GPU_LABELS, registry=r)
        self.gpu_power = Gauge("caldera_gpu_power_watts", "power draw", GPU_LABELS, registry=r)
        self.gpu_temp = Gauge("caldera_gpu_temperature_celsius", "temperature", GPU_LABELS, registry=r)
        self.gpu_prof = Gauge("caldera_gpu_profiling_ratio", "DCGM/GPM field", (*GPU_LABELS, "field"), registry=r)
        self.job_gpu_util = Gauge(
            "caldera_job_gpu_utilisation_percent", "utilisation of a GPU a job holds", JOB_GPU_LABELS, registry=r
        )
        self.job_gpu_mem = Gauge(
            "caldera_job_gpu_memory_used_bytes", "memory used on a GPU a job holds", JOB_GPU_LABELS, registry=r
        )
        self.job_cpu = Gauge("caldera_job_cpu_seconds", "CPU time of the job's processes", JOB_LABELS, registry=r)
        self.job_mem = Gauge("caldera_job_memory_bytes", "memory of the job's processes", JOB_LABELS, registry=r)
        self.job_read = Gauge("caldera_job_read_bytes", "bytes the job read from storage", JOB_LABELS, registry=r)
        self.job_write = Gauge("caldera_job_write_bytes", "bytes the job wrote to storage", JOB_LABELS, registry=r)
        self.sample_seconds = Counter(
            "caldera_agent_sample_seconds", "time the agent spent sampling", ("node",), registry=r
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample_once(self, at: float | None = None) -> None:
        """One round: replaces every series so a job that ended, or a device that vanished, leaves none behind."""
        started = time.perf_counter()
        at = time.time() if at is None else at
        holdings = [h for h in self.holdings() if h.end is None or h.end > at]
        tree = process_tree() if any(h.cgroup is None and h.pids for h in holdings) else {}
        stats = {h.job: self._job_stats(h, tree) for h in holdings}
        pids_of = {h.job: set(h.pids) for h in holdings}
        samples = self.source.sample(holdings, at)
        for gauge in (self.gpu_util, self.gpu_mem, self.gpu_mem_total, self.gpu_clock, self.gpu_power,
                      self.gpu_temp, self.gpu_prof, self.job_gpu_util, self.job_gpu_mem, self.job_cpu,
                      self.job_mem, self.job_read, self.job_write):  # fmt: skip
            gauge.clear()
        for s in samples:
            self._gpu(s, holders_of(s, holdings, pids_of))
        for h in holdings:
            st = stats[h.job]
            if st is None:
                continue
            labels = (self.node, h.job, h.user, h.account, h.queue)
            self.job_cpu.labels(*labels).set(st.cpu_seconds)
            self.job_mem.labels(*labels).set(st.memory_bytes)
            self.job_read.labels(*labels).set(st.read_bytes)
            self.job_write.labels(*labels).set(st.write_bytes)
        self.sample_seconds.labels(self.node).inc(time.perf_counter() - started)

    def _gpu(self, s: GpuSample, holders: list[Holding]) -> None:
        labels = (self.node, str(s.gpu), s.model)
        self.gpu_util.labels(*labels).set(s.utilisation)
        self.gpu_mem.labels(*labels).set(s.memory_used)
        self.gpu_mem_total.labels(*labels).set(s.memory_total)
        for gauge, value in ((self.gpu_clock, s.sm_clock_mhz), (self.gpu_power, s.power_w),
                             (self.gpu_temp, s.temperature_c)):  # fmt: skip
            if value is not None:
                gauge.labels(*labels).set(value)
        for field, value in s.profiling.items():
            self.gpu_prof.labels(*labels, field).set(value)
        for h in holders:
            job_labels = (*labels, h.job, h.user, h.account, h.queue)
            self.job_gpu_util.labels(*job_labels).set(s.utilisation)
            self.job_gpu_mem.labels(*job_labels).set(s.memory_used)

    @staticmethod
    def _job_stats(h: Holding, tree: dict[int, list[int]]) -> JobStats | None:
        try:
            if h.cgroup is not None:
                return cgroup_stats(h.cgroup)
            return process_tree_stats(h.pids, tree) if h.pids else None
        except (OSError, ValueError) as exc:  # the cgroup went away with the job
            log.debug("no stats for job %s: %s", h.job, exc)
            return None

    def serve(self, port: int, host: str = "127.0.0.1") -> Any:
        """Expose the series over HTTP; returns the server (``shutdown()`` ends it)."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return server

    def start(self, interval_s: float) -> None:
        """Sample every ``interval_s`` in a daemon thread; a failing round is logged, never ends the agent."""

        def loop() -> None:
            while not self._stop.is_set():
                try:
                    self.sample_once()
                except Exception:  # noqa: BLE001 - a broken source must not end the sampling of jobs
                    log.exception("metrics sample failed")
                self._stop.wait(interval_s)

        self._thread = threading.Thread(target=loop, name="metrics-agent", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
