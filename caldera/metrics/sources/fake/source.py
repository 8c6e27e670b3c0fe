"""The fake GPU source: on a host without GPUs (``settings.fake_gpus``) each job declares its load in a file in its
working directory, ``gpu_load.json`` (``{"utilisation": 80, "memory_mib": 4000}``, optionally per device index:
``{"0": {...}, "1": {...}}``), and the source reports it as NVML would for the devices the job holds."""

from __future__ import annotations

import json
import os
import stat

from caldera.config import Settings
from caldera.metrics.sources.base import GpuSample, Holding, SourceUnavailable

LOAD_FILE = "gpu_load.json"
MAX_LOAD_BYTES = 4096  # the file is the job's: read no more than a load needs


def _read_regular(path: os.PathLike) -> bytes:
    """The job's file, read by the agent (root): never through a symlink (it could name any file of the host), never
    a FIFO or device that would block the sampling, at most MAX_LOAD_BYTES."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        return os.read(fd, MAX_LOAD_BYTES)
    finally:
        os.close(fd)


def _load_of(holding: Holding, gpu: int) -> tuple[float, int]:
    """(utilisation %, memory bytes) the job declares for ``gpu``; (0, 0) when it declares nothing readable."""
    if holding.workdir is None:
        return 0.0, 0
    try:
        data = json.loads(_read_regular(holding.workdir / LOAD_FILE))
        if isinstance(data, dict) and str(gpu) in data:
            data = data[str(gpu)]
        util = min(100.0, max(0.0, float(data.get("utilisation", 0))))
        mem = max(0, int(data.get("memory_mib", 0))) * 1024 * 1024
    except (OSError, ValueError, TypeError, AttributeError):
        return 0.0, 0
    return util, mem


class FakeSource:
    name = "fake"

    def __init__(self, settings: Settings) -> None:
        if not settings.fake_gpus:
            raise SourceUnavailable("no fake GPUs declared (setting fake_gpus)")
        self.gpus = settings.fake_gpus

    def sample(self, holdings: list[Holding], at: float) -> list[GpuSample]:
        out = []
        for index, gpu in enumerate(self.gpus):
            total = gpu.memory_mib * 1024 * 1024
            util, mem = 0.0, 0
            for h in holdings:
                if h.holds(index, at):
                    u, m = _load_of(h, index)
                    util, mem = min(100.0, util + u), min(total, mem + m)
            out.append(
                GpuSample(gpu=index, model=gpu.model, at=at, utilisation=util, memory_used=mem, memory_total=total)
            )
        return out
