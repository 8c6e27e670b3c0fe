"""Which jobs a GPU sample belongs to: only jobs that held the device at the sample's time, so a sample taken after
a job ended is never given to the next job placed on that GPU. On a shared GPU, where the source sees processes
(NVML), the holders whose processes use its memory; else every holder."""

from __future__ import annotations

from caldera.metrics.sources.base import GpuSample, Holding


def holders_of(sample: GpuSample, holdings: list[Holding], pids_of: dict[str, set[int]]) -> list[Holding]:
    """``pids_of``: each job's process tree (job id -> pids)."""
    holders = [h for h in holdings if h.holds(sample.gpu, sample.at)]
    if len(holders) > 1 and sample.process_memory:
        using = [h for h in holders if pids_of.get(h.job, set()) & sample.process_memory.keys()]
        return using or holders
    return holders
