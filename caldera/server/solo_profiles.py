"""Solo records measured by the platform itself: a shareable job's first minutes alone on its GPU.

``caldera profile`` measures a zoo of workloads; the jobs users actually run are measured here, into the same solo
record (``SOLO_COLUMNS``), so the decay model can be retrained from them (``caldera interference train --records
<data dir>/profiles``). While a shareable one-GPU job runs alone on its GPU, for its first ``sharing_profile_s``
seconds the platform samples that device through NVML with the profiler's own sampler (utilisation, memory-copy
utilisation, PCIe; SM active / occupancy / DRAM bandwidth where NVML's GPM has them) and, where the runtime can see
them (an optional ``usage(handle)``, the process runtime), the job's processes: CPU use and peak resident memory.
When the window ends it appends one row to ``<data dir>/profiles/solo.csv`` and notes a ``Profiled`` event on the job.

A record must be of the job alone: a partner joining the GPU, a cancel or preemption request, or the job ending
first drops the window. ``speed`` and ``iter_avg_ms`` stay empty (not measured): the platform cannot see a job's
training steps. GPU columns stay empty where the device is not this host's NVML device (declared fake GPUs,
Kubernetes nodes).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from caldera.config import Settings
from caldera.core.cluster import Node
from caldera.db.models import Job
from caldera.interference.profile.gpu_metrics import GpuSampler
from caldera.interference.profile.harness import SOLO_COLUMNS, append_records
from caldera.interference.records import JobType
from caldera.runtime.base import Handle, ProcessUsage, Runtime

log = logging.getLogger("caldera.profiles")
# reading a job's processes walks /proc: every few seconds is plenty for CPU % and peak memory; NVML every second
USAGE_PERIOD_S, GPU_PERIOD_S = 5.0, 1.0
_HOST_RUNTIMES = ("local", "container")  # their GPUs are this host's NVML devices
_Key = tuple[str, int]


@dataclass
class _Window:
    """One job's measurement in progress."""

    node: str
    gpu: int
    gpu_model: str
    opened: float
    sampler: GpuSampler | None
    first: ProcessUsage | None = None
    last: ProcessUsage | None = None
    first_at: float = 0.0
    last_at: float = 0.0
    peak_rss_mib: float = 0.0
    next_usage_at: float = 0.0
    gpu_metrics: dict[str, float] = field(default_factory=dict)

    def stop_sampler(self) -> None:
        if self.sampler is not None:
            self.sampler.stop.set()
            self.sampler.join(timeout=5)
            self.gpu_metrics = self.sampler.record()
            self.sampler = None


class SoloProfiler:
    """Called once per scheduling cycle with the running jobs; keeps a measurement window per shareable job."""

    def __init__(self, settings: Settings, runtime: Runtime, nvml: Any = None) -> None:
        self.window_s = settings.sharing_profile_s
        # at least ten samples in a window, however short an admin makes it
        self.usage_period_s = min(USAGE_PERIOD_S, self.window_s / 10)
        self.gpu_period_s = min(GPU_PERIOD_S, self.window_s / 10)
        self.path = settings.profiles_dir / "solo.csv"
        self.runtime = runtime
        self.nvml = nvml  # a fake in tests; pynvml otherwise
        self._windows: dict[_Key, _Window] = {}
        self._done: set[_Key] = set()  # measured or dropped: never measured again

    def cycle(self, running: Iterable[Job], nodes: list[Node], now: float) -> list[tuple[Job, str, dict[str, Any]]]:
        """Open, advance and close windows; returns each job whose record was written, with what it says (in
        English, and the values it was made from)."""
        running = list(running)
        holders = Counter((a["node"], g) for job in running for a in job.allocations for g in a["gpus"])
        models = {(n.name, d.index): d.model for n in nodes for d in n.gpus}
        written = []
        for job in running:
            key = (job.id, job.attempt)
            where = None if job.stop_requested else _alone_on(job, holders)  # a stopping job is winding down
            w = self._windows.get(key)
            if w is None:
                if not (where and key not in self._done and self._starts_now(job, now)):
                    continue
                w = self._windows[key] = self._open(where, models.get(where, "unknown"), now)
            elif where is None:  # a partner joined: what follows is no solo measurement
                self._drop(key)
                continue
            self._sample_usage(w, job, now)
            if now - w.opened >= self.window_s:
                written.append((job, *self._close(key, w, job)))
        running_keys = {(job.id, job.attempt) for job in running}
        for key in set(self._windows) - running_keys:
            self._drop(key)  # ended, preempted or cancelled within its window
        self._done &= running_keys
        return written

    def close(self) -> None:
        for key in list(self._windows):
            self._drop(key)

    def _starts_now(self, job: Job, now: float) -> bool:
        """A shareable job still in its first window (a server restarted within it measures the rest)."""
        return bool(job.spec.get("shareable")) and job.started_at is not None and now - job.started_at < self.window_s

    def _open(self, where: tuple[str, int], gpu_model: str, now: float) -> _Window:
        return _Window(where[0], where[1], gpu_model, now, self._sampler(where[1]))

    def _sampler(self, index: int) -> GpuSampler | None:
        if getattr(self.runtime, "name", "") not in _HOST_RUNTIMES and self.nvml is None:
            return None
        try:
            sampler = GpuSampler(index, period_s=self.gpu_period_s, nvml=self.nvml)
        except Exception as exc:  # noqa: BLE001 - no NVML here (declared fake GPUs): CPU columns only
            log.debug("no GPU metrics for device %s: %s", index, exc)
            return None
        sampler.start()
        return sampler

    def _sample_usage(self, w: _Window, job: Job, now: float) -> None:
        usage_of = getattr(self.runtime, "usage", None)
        if usage_of is None or now < w.next_usage_at:
            return
        w.next_usage_at = now + self.usage_period_s
        try:
            u = usage_of(Handle(job.id, job.attempt, job.handle or {}))
        except Exception as exc:  # noqa: BLE001 - a profile is worth less than the cycle
            log.warning("could not read the processes of job %s: %s", job.id, exc)
            return
        if u is None:
            return
        if w.first is None:
            w.first, w.first_at = u, now
        w.last, w.last_at = u, now
        w.peak_rss_mib = max(w.peak_rss_mib, u.rss_mib)

    def _drop(self, key: _Key) -> None:
        w = self._windows.pop(key, None)
        if w is not None:
            w.stop_sampler()
        self._done.add(key)

    def _close(self, key: _Key, w: _Window, job: Job) -> tuple[str, dict[str, Any]]:
        self._windows.pop(key)
        self._done.add(key)
        w.stop_sampler()
        row = _record(job, w)
        append_records(self.path, SOLO_COLUMNS, [row])
        return _summary(row, w, self.window_s), _params(row, w, self.window_s)


def _alone_on(job: Job, holders: Counter[tuple[str, int]]) -> tuple[str, int] | None:
    """(node, GPU) of a one-GPU job that no other running job holds a share of."""
    gpus = [(a["node"], g) for a in job.allocations for g in a["gpus"]]
    if len(gpus) != 1 or holders[gpus[0]] != 1:
        return None
    return gpus[0]


def _record(job: Job, w: _Window) -> dict[str, Any]:
    workload = job.spec.get("workload")
    kind = JobType.parse(workload) if workload else JobType(job.spec.get("name") or job.id, 0)
    row: dict[str, Any] = {"model": kind.family, "gpu_num": 1, "batchsize": kind.batch_size, "gpu": w.gpu_model}
    row.update(w.gpu_metrics)
    if w.first is not None and w.last is not None and w.last_at > w.first_at:
        row["cpu_usage"] = 100.0 * max(0.0, w.last.cpu_s - w.first.cpu_s) / (w.last_at - w.first_at)
    if w.peak_rss_mib:
        row["cpu_mem_max"] = w.peak_rss_mib
    return row


def _params(row: dict[str, Any], w: _Window, window_s: float) -> dict[str, Any]:
    """The event's values, for the portal's Profiled message (reason_text.py); a measure not taken is left out."""
    out: dict[str, Any] = {"window_s": round(window_s), "node": w.node, "gpu": w.gpu, "gpu_model": w.gpu_model}
    for col, key in (("gpu_util_avg", "gpu_util"), ("sm_active_avg", "sm_active"), ("cpu_usage", "cpu"),
                     ("cpu_mem_max", "memory_mib")):  # fmt: skip
        if col in row:
            out[key] = round(row[col])
    return out


def _summary(row: dict[str, Any], w: _Window, window_s: float) -> str:
    measured = [
        f"{label} {row[col]:.0f}%"
        for col, label in (("gpu_util_avg", "GPU utilisation"), ("sm_active_avg", "SM active"))
        if col in row
    ]
    if "cpu_usage" in row:
        measured.append(f"CPU {row['cpu_usage']:.0f}% of a core")
    if "cpu_mem_max" in row:
        measured.append(f"peak memory {row['cpu_mem_max']:.0f} MiB")
    what = ", ".join(measured) or "nothing measurable here"
    return (
        f"solo profile of its first {window_s:.0f} s alone on {w.node} GPU {w.gpu} ({w.gpu_model}): {what}; "
        f"added to the platform's profile records ({Path('profiles') / 'solo.csv'} in the data directory)"
    )
