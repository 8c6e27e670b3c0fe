"""First in, first out with exclusive gangs: the job at the head waits until it fits, and blocks everyone behind
it (what a default Volcano or Kubernetes queue does).

Order: ``queued_since`` (``submitted_at`` when unset), then id. No quotas, priorities or preemption. A job that can
never fit the cluster does not block the queue (it gets ``NeverFits``; submission normally refuses it). The head
gets ``GangNoFit``; everyone behind it ``QueuePosition`` with ``details["blocked_by"]``.
"""

from __future__ import annotations

import math

from caldera.scheduler.engine import CycleBase
from caldera.scheduler.ordering import gc_paused, queued_since, sort_order
from caldera.scheduler.snapshot import Decisions, Snapshot


class _Cycle(CycleBase):
    def timed_wake(self) -> float:
        """Nothing here depends on time: only jobs arriving or ending change what starts."""
        return math.inf


class FifoPolicy:
    """Options: ``default_runtime_estimate_s`` (3600; used for the estimated start of waiting jobs)."""

    name = "fifo"

    def __init__(self, *, default_runtime_estimate_s: float = 3600.0) -> None:
        self.default_runtime_estimate_s = float(default_runtime_estimate_s)

    def __call__(self, snap: Snapshot) -> Decisions:
        with gc_paused():
            c = _Cycle(snap, self.default_runtime_estimate_s)
            idx = c.idx
            queued = snap.queued
            oi = sort_order(queued, queued_since(queued))
            c.oia = oi
            blocked: str | None = None
            for pos, k in enumerate(oi.tolist()):
                job = queued[k]
                req = job.request
                g, model, n = req.gpu, req.gpu_model, job.replicas
                if g and c.never_quick(g, model, n):
                    c.explicit.append((pos, c.never(job, g, model, n)))
                    continue
                plan = idx.place(g, model, req.cpu, req.memory_mib, n)
                if plan is not None:
                    c.start(job, plan, g, req.cpu, req.memory_mib)
                    c.started_idx.append(pos)
                    continue
                blocked = job.id
                c.explicit.append((pos, c.nofit_reason(g, model, req.cpu, req.memory_mib, n, None, None, False)))
                head_pos = pos - len(c.starts) + 1
                break  # everyone behind waits: the rest of the queue only gets positions
            if blocked is None:
                return c.decisions()
            return c.decisions(extra={"blocked_by": blocked}, extra_text=f", behind {blocked}", extra_from=head_pos + 1)
