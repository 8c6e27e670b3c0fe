"""First in, first out with exclusive gangs: the job at the head waits until it fits, and blocks everyone behind
it (what a default Volcano or Kubernetes queue does)."""
from __future__ import annotations

from caldera.scheduler.placement import free_capacity, place_gang
from caldera.scheduler.snapshot import Decisions, Reason, Snapshot, Start


class FifoPolicy:
    name = "fifo"

    def __call__(self, snap: Snapshot) -> Decisions:
        out = Decisions()
        free = free_capacity(snap.nodes, snap.running)
        queue = sorted(snap.queued, key=lambda j: (j.queued_since or j.submitted_at, j.id))
        blocked_by: str | None = None
        for pos, job in enumerate(queue, start=1):
            if blocked_by is None:
                alloc = place_gang(free, job.request, job.replicas)
                if alloc is not None:
                    out.starts.append(Start(job.id, alloc))
                    continue
                blocked_by = job.id
                out.pending[job.id] = [Reason("InsufficientResources",
                                              f"needs {job.replicas} x {job.request.gpu} GPUs and they are not free")]
            else:
                out.pending[job.id] = [Reason("QueuePosition", f"position {pos} in the queue, behind {blocked_by}",
                                              {"position": pos, "blocked_by": blocked_by})]
        return out
