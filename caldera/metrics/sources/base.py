"""What a metric source gives the agent: one sample per GPU, with the processes using it where the source knows."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


class SourceUnavailable(Exception):
    """A metric source that cannot run here; the message says why."""


@dataclass(frozen=True)
class Holding:
    """A job holding GPUs on this node from ``start`` until ``end`` (None: still running)."""

    job: str
    user: str
    account: str
    queue: str
    gpus: tuple[int, ...]
    start: float
    end: float | None = None
    pids: tuple[int, ...] = ()
    workdir: Path | None = None
    cgroup: Path | None = None

    def holds(self, gpu: int, at: float) -> bool:
        """Whether this job held ``gpu`` at time ``at``: a sample taken after its end belongs to nobody."""
        return gpu in self.gpus and self.start <= at and (self.end is None or at < self.end)


@dataclass(frozen=True)
class GpuSample:
    """One device at one time. ``process_memory``: bytes of GPU memory per pid, where the source sees processes."""

    gpu: int
    model: str
    at: float
    utilisation: float  # percent of time a kernel ran
    memory_used: int  # bytes
    memory_total: int  # bytes
    sm_clock_mhz: float | None = None
    power_w: float | None = None
    temperature_c: float | None = None
    profiling: dict[str, float] = field(default_factory=dict)  # sm_active, sm_occupancy, dram_active, pcie_tx...
    process_memory: dict[int, int] = field(default_factory=dict)


class MetricSource(Protocol):
    name: str

    def sample(self, holdings: list[Holding], at: float) -> list[GpuSample]:
        """One sample per device of this node at time ``at``; ``holdings`` for sources that learn load from jobs."""
        ...
