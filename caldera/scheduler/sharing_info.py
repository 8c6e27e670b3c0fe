"""What the scheduler knows about GPU interference, as plain data in the snapshot (see :mod:`sharing`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from caldera.core.tenancy import QueueConfig
from caldera.scheduler.job import SchedJob

Mix = tuple[str, ...]  # workload keys, sorted


@dataclass(slots=True, frozen=True)
class SharingInfo:
    """What the scheduler knows about interference, as plain data.

    ``decay[(gpu_model, mix)]`` holds the predicted decay of each workload of the sorted ``mix`` (same order);
    ``workload[job_id]`` is a job's workload key (its profile); a job without one is unknown. A job's tolerance is
    its own ``decay_tolerance``, else its queue's (``QueueConfig.decay_tolerance``), else ``default_tolerance``.
    """

    decay: Mapping[tuple[str, Mix], tuple[float, ...]] = field(default_factory=dict)
    workload: Mapping[str, str] = field(default_factory=dict)
    default_tolerance: float = 0.3
    max_jobs_per_gpu: int = 2
    # a shareable job the inner policy starts on a free GPU joins an occupied one instead when that raises the
    # occupied GPU's predicted normalised throughput by more than this (keeps free GPUs for gangs); None: never
    prefer_gain: float | None = None
    unavailable: str = ""  # why there are no predictions at all (e.g. no model file), for the jobs' why
    # a mix is formed only when it raises the GPU's predicted normalised throughput by more than this: slack for
    # the model's error (a pair predicted barely worth it is often worse in truth)
    min_gain: float = 0.0
    # a waiting job shares only if queued before every waiting exclusive GPU job: sharing then never lets it
    # overtake a blocked gang, whose GPUs a stream of co-runners would otherwise never let drain
    keep_order: bool = False
    # the first this many waiting shareable jobs are placed best pair first (see share_placements); 1: queue order
    match_window: int = 1
    # the GPUs the first waiting exclusive job (a blocked gang) would take once they drain take no new partner
    # (see drain_set): sharing goes on elsewhere, but never keeps the gang's GPUs from freeing up
    drain_for_blocked: bool = False
    # with drain_for_blocked: a free GPU outside that set, which FIFO would leave idle behind the blocked job, is
    # opened to the earliest waiting shareable job together with its best waiting partner (never to one job alone)
    # when their predicted normalised throughput beats one job alone by prefer_gain (else min_gain): the bar at
    # which a started job takes an occupied GPU over a free one
    pair_on_free: bool = False

    def tolerance(self, job: SchedJob, queues: Mapping[str, QueueConfig] | None = None) -> float:
        if job.decay_tolerance is not None:
            return job.decay_tolerance
        q = (queues or {}).get(job.queue)
        if q is not None and q.decay_tolerance is not None:
            return q.decay_tolerance
        return self.default_tolerance

    def predicted(self, gpu_model: str, jobs: list[SchedJob]) -> dict[str, float] | None:
        """Each job's predicted decay in this mix, by job id; None when a job or the mix is unknown."""
        if len(jobs) == 1:
            return {jobs[0].id: 0.0}
        keys = [self.workload.get(j.id) for j in jobs]
        if any(k is None for k in keys):
            return None
        order = sorted(range(len(jobs)), key=lambda i: keys[i])  # type: ignore[arg-type, return-value]
        decays = self.decay.get((gpu_model, tuple(keys[i] for i in order)))  # type: ignore[misc]
        if decays is None:
            return None
        return {jobs[i].id: d for i, d in zip(order, decays)}
