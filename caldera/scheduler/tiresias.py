"""The ``tiresias`` policy: discretised two-dimensional least-attained-service (Gu et al., NSDI 2019), kept simple.

* A job's service is ``attained_gpu_s`` (GPUs x seconds: the two dimensions, space and time, in one number). The
  ``thresholds_gpu_s`` cut it into priority levels: level 0 below the first threshold, level 1 up to the second,
  and so on. Lower levels go first; within a level first come, first served (``queued_since``, then id).
* Gangs are all-or-nothing with the usual packing (:mod:`placement`); a job that does not fit is skipped, the next
  one may start (no head-of-line blocking).
* Preemptive (``preemptive``, default on): a job that does not fit may preempt running jobs in strictly *higher*
  levels (more attained service), highest level first, then youngest; ``Preempt.reason`` ``LeastAttainedService``.
  Resources of terminating jobs are counted as soon-free first, as in ``caldera``.
* No quotas, user caps, priority classes or reservations.

``attained_gpu_s`` of a running job must include its current run up to ``Snapshot.now`` (the live loop and the
simulator set it that way), so a running job sinks through the levels as it runs and new work overtakes it.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator, Sequence
from operator import attrgetter

import numpy as np

from caldera.scheduler.engine import CycleBase, Victim
from caldera.scheduler.ordering import gpus_per_replica, queued_since, sort_order
from caldera.scheduler.reasons import PREEMPT_LAS, WAITING_FOR_PREEMPTION, num
from caldera.scheduler.snapshot import Decisions, Preempt, Reason, SchedJob, Snapshot

_ATT = attrgetter("attained_gpu_s")


class TiresiasPolicy:
    """Options: ``thresholds_gpu_s`` (level boundaries in GPU-seconds; default 1 and 10 GPU-hours),
    ``preemptive`` (True), ``max_preemptions_per_cycle`` (32; the rest wait for the next cycle),
    ``default_runtime_estimate_s`` (3600; for estimated starts)."""

    name = "tiresias"

    def __init__(
        self,
        *,
        thresholds_gpu_s: Sequence[float] = (3600.0, 36000.0),
        preemptive: bool = True,
        max_preemptions_per_cycle: int | None = 32,
        default_runtime_estimate_s: float = 3600.0,
    ) -> None:
        self.thresholds_gpu_s = tuple(sorted(float(t) for t in thresholds_gpu_s))
        self.preemptive = bool(preemptive)
        self.max_preemptions_per_cycle = max_preemptions_per_cycle
        self.default_runtime_estimate_s = float(default_runtime_estimate_s)

    def level(self, attained_gpu_s: float) -> int:
        return bisect.bisect_right(self.thresholds_gpu_s, attained_gpu_s)

    def __call__(self, snap: Snapshot) -> Decisions:
        return _Cycle.decide(self, snap)


class _Cycle(CycleBase):
    def __init__(self, pol: TiresiasPolicy, snap: Snapshot) -> None:
        super().__init__(snap, pol.default_runtime_estimate_s)
        self.pol = pol
        K = len(pol.thresholds_gpu_s) + 1
        self.K = K
        self.level_gpus = [0] * K
        self.victims: list[Victim] = []
        self.nofit: set[tuple] = set()
        self.nopre: set[tuple] = set()
        idx = self.idx
        for job in snap.running:
            req = job.request
            gpus = req.gpu * job.replicas
            model = req.gpu_model
            if gpus and model is None and job.allocations:
                model = idx.allocation_model(job.allocations[0])
            v = Victim(job, 2, gpus, model)
            v.level = pol.level(job.attained_gpu_s)
            if job.terminating:
                self.add_soon_free(v)
            elif gpus:
                self.victims.append(v)
                self.level_gpus[v.level] += gpus
        self.victims.sort(key=lambda v: (-v.level, -v.started))
        queued = snap.queued
        n = len(queued)
        qs = queued_since(queued)
        att = np.fromiter(map(_ATT, queued), dtype=np.float64, count=n)
        lev = np.searchsorted(np.asarray(pol.thresholds_gpu_s, dtype=np.float64), att, side="right")
        oia = sort_order(queued, qs, lev)
        self.oia = oia
        self.k_sorted = lev[oia].astype(np.intp)
        self.g_sorted = gpus_per_replica(queued)[oia]
        self.init_groups(K)
        self.directed_levels: set[int] = set()
        for k in self.resolve_directed():
            self.directed_levels.add(int(lev[k]))
        self._refresh_pre()

    def all_victims(self) -> Iterator[Victim]:
        yield from self.victims
        yield from self.anon
        for lst in self.directed.values():
            yield from lst

    def timed_wake(self) -> float | None:
        """Running jobs sink through the levels as they run, and a job that sank may be preempted by one waiting in
        a lower level: the next such crossing (queued jobs' service does not grow)."""
        th = self.pol.thresholds_gpu_s
        now = self.now
        t = math.inf
        running = [(v.attained, v.gpus) for v in self.victims if not v.chosen]
        running += [(j.attained_gpu_s, j.request.gpu * j.replicas) for j in self.started_jobs]
        for att, g in running:
            if g:
                L = bisect.bisect_right(th, att)
                if len(th) > L:
                    t = min(t, now + (th[L] - att) / g)
        return t

    def _more(self) -> bool:
        cap = self.pol.max_preemptions_per_cycle
        return (cap is None or len(self.preemptions) < cap) and not self.gave_up

    def close_avenues(self) -> None:
        self._refresh_pre()

    def _refresh_pre(self) -> None:
        above = 0
        more = self.pol.preemptive and self._more()
        for L in range(self.K - 1, -1, -1):
            ok = (self.anon_open > 0 and not self.gave_up) or L in self.directed_levels or (more and above > 0)
            self.set_pre(L, self.nmax if ok else 0)
            above += self.level_gpus[L]

    def consider(self, job: SchedJob, L: int) -> Reason | None:
        req = job.request
        g, model, cpu, mem, n = req.gpu, req.gpu_model, req.cpu, req.memory_mib, job.replicas
        if g and self.never_quick(g, model, n):
            return self.never(job, g, model, n)
        shape = (g, model, cpu, mem, n)
        idx = self.idx
        if shape not in self.nofit:
            plan = idx.place(g, model, cpu, mem, n)
            if plan is not None:
                self.start(job, plan, g, cpu, mem)
                return None
            self.nofit.add(shape)
        if g:
            r = self._preempt(job, L, g, model, cpu, mem, n, shape)
            if r is not None:
                return r
        return self.nofit_reason(g, model, cpu, mem, n, None, None, False)

    def _candidates(self, job: SchedJob, L: int, model: str | None, directed: list[Victim]) -> Iterator[Victim]:
        yield from directed
        if self.gave_up:
            return
        for v in self.anon:
            if not v.claimed and (model is None or v.model == model):
                yield v
        if not self.pol.preemptive or not self._more():
            return
        for v in self.victims:
            if v.level <= L:
                break  # sorted by level, highest first
            if not v.chosen and (model is None or v.model == model):
                yield v

    def _preempt(
        self, job: SchedJob, L: int, g: int, model: str | None, cpu: float, mem: int, n: int, shape: tuple
    ) -> Reason | None:
        directed = [v for v in self.directed.get(job.id, ()) if not v.claimed]
        above = sum(self.level_gpus[L + 1 :]) if self.pol.preemptive and self._more() else 0
        anon = self.anon_open if not self.gave_up else 0
        if not directed and not anon and not above:
            return None
        if self.idx.free_gpus(model) + sum(v.gpus for v in directed) + anon + above < g * n:
            return None
        pkey = (L, shape)
        if not directed and pkey in self.nopre:
            return None
        got = self.try_with(g, model, cpu, mem, n, None, None, self._candidates(job, L, model, directed))
        if got is None:
            if not directed:
                self.nopre.add(pkey)
            return None
        _, needed = got
        new = [v for v in needed if not v.soon]
        for v in needed:
            if v.soon:
                v.claimed = True
                if v in self.anon:
                    self.anon_open -= v.gpus
        for v in new:
            v.chosen = True
            self.chosen.append(v)
            self.level_gpus[v.level] -= v.gpus
            self.preemptions.append(
                Preempt(
                    v.id,
                    job.id,
                    PREEMPT_LAS,
                    f"job {v.id} (attained {num(round(v.attained))} GPU-s, LAS level {v.level}) preempted by job "
                    f"{job.id} (LAS level {L}): jobs with less attained service go first",
                )
            )
        if needed:
            self._refresh_pre()
        ids = [v.id for v in needed]
        what = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
        return Reason(
            WAITING_FOR_PREEMPTION,
            f"waiting for {len(ids)} preempted job{'s' if len(ids) != 1 else ''} ({what}) to release their resources",
            {"victims": ids, "new_preemptions": [v.id for v in new], "soon_free_gpus": sum(v.gpus for v in needed)},
        )
