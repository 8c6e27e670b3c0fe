"""GPU sharing: shareable jobs placed on GPUs other shareable jobs already use.

:class:`SharingPolicy` wraps any policy. The inner policy decides as if GPUs were exclusive; then each queued
shareable job it did not start, in queue order, may join an occupied GPU when

* every job on that GPU is shareable (exclusive jobs are never co-located) and the GPU has room for one more
  (``SharingInfo.max_jobs_per_gpu``);
* (a gang: a job of several GPUs) the GPUs are those of jobs of its own shape (replicas x GPUs per replica) that
  hold exactly them, each GPU with the same partners, so every rank runs next to the same partner type and the
  ranks slow down alike; a gang never shares one GPU of its set only (Gavel's model of space sharing; it measured
  no such pair, so the job spec keeps sharing to one-GPU jobs for now);
* the GPU-memory requests (``Resources.gpu_memory_mib``) of all of them fit the device's memory, and the node has
  the job's CPU and memory;
* (interference-aware mode) the predicted decay of *every* job of the new mix stays within that job's tolerance,
  and the mix's predicted normalised throughput (sum of ``1 - decay``) grows. Among such GPUs it takes the one that
  grows it most. A mix with a job the predictions do not cover (no profile yet) is not formed: unknown jobs run
  alone.

With ``SharingInfo.prefer_gain``, a shareable job the inner policy started on a free GPU is moved onto an occupied
one where the predicted gain is at least that high, leaving the free GPU to others (gangs behind it, with FIFO).
The inner policy approved the start, so no quota is bypassed.

Naive mode (``aware=False``) shares whenever memory fits, on the GPU with the fewest jobs.

Predictions are data in the snapshot (:class:`SharingInfo`), filled by the live loop or the simulator from the
decay model; this module never imports the ML stack. A job the inner policy holds back for a policy reason (a quota,
a user cap, a reservation) is not shared past it: only jobs waiting for capacity are (with ``Snapshot.explain``
off there are no reasons, and every waiting shareable job is a candidate).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from caldera.core.cluster import Allocation
from caldera.core.tenancy import QueueConfig
from caldera.scheduler.reasons import (
    GANG_NO_FIT,
    QUEUE_POSITION,
    SHARING_DECLINED,
    LazyPending,
    said_reasons,
    specific_reasons,
)
from caldera.scheduler.sharing_info import Mix, SharingInfo
from caldera.scheduler.snapshot import Decisions, Policy, Reason, SchedJob, Snapshot, Start

__all__ = ["Mix", "SharingInfo", "SharingPolicy", "can_share", "share_placements"]

CAPACITY_CODES = frozenset({GANG_NO_FIT, QUEUE_POSITION, SHARING_DECLINED})


def can_share(job: SchedJob) -> bool:
    return job.shareable and job.request.gpu >= 1 and job.request.gpu_memory_mib is not None


@dataclass(slots=True)
class _Gpu:
    """A place a job can join: one GPU, or the GPUs of a gang whose every GPU holds the same jobs (all ranks of
    each job next to the same partners). ``layout`` is where its jobs' replicas run: a newcomer takes the same."""

    layout: tuple[tuple[str, tuple[int, ...]], ...]  # (node, GPU indices) per replica
    model: str
    memory_mib: int  # the smallest device's
    jobs: list[SchedJob]

    @property
    def where(self) -> str:
        return ", ".join(f"{n} GPU{'s' if len(g) > 1 else ''} {','.join(map(str, g))}" for n, g in self.layout)

    def fits_shape(self, job: SchedJob) -> bool:
        return len(self.layout) == job.replicas and all(len(g) == job.request.gpu for _, g in self.layout)


class _Occupancy:
    """Occupied GPUs open to sharing and each node's free CPU and memory, after the inner policy's starts."""

    def __init__(self, snap: Snapshot, starts: list[Start]) -> None:
        queued = {j.id: j for j in snap.queued}
        placed: list[tuple[SchedJob, tuple[Allocation, ...]]] = [(j, j.allocations) for j in snap.running]
        placed += [(queued[s.job_id], s.allocations) for s in starts if s.job_id in queued]
        self.cpu = {n.name: n.cpu for n in snap.nodes if n.schedulable}
        self.mem = {n.name: n.memory_mib for n in snap.nodes if n.schedulable}
        devices = {(n.name, d.index): d for n in snap.nodes if n.schedulable for d in n.gpus}
        by_gpu: dict[tuple[str, int], list[SchedJob]] = {}
        layout: dict[str, tuple[tuple[str, tuple[int, ...]], ...]] = {}
        for job, allocs in placed:
            layout[job.id] = tuple((a.node, a.gpus) for a in allocs)
            self._use(allocs)
            for a in allocs:
                for g in a.gpus:
                    by_gpu.setdefault((a.node, g), []).append(job)
        self.gpus: list[_Gpu] = []
        seen: set[tuple[str, ...]] = set()
        for jobs in by_gpu.values():
            ids = tuple(j.id for j in jobs)
            if ids in seen or not all(can_share(j) and not j.terminating for j in jobs):
                continue
            seen.add(ids)
            lay = layout[ids[0]]
            keys = [(n, g) for n, gs in lay for g in gs]
            # every job of the mix on exactly these GPUs, each of them schedulable and holding just these jobs
            if any(layout[i] != lay for i in ids) or any(k not in devices for k in keys):
                continue
            if any(tuple(j.id for j in by_gpu.get(k, ())) != ids for k in keys):
                continue
            mem = min(devices[k].memory_mib for k in keys)
            self.gpus.append(_Gpu(lay, devices[keys[0]].model, mem, jobs))
        self.free = [k for k in devices if k not in by_gpu]
        self.devices = devices

    def free_gpus(self, excluded: frozenset[tuple[str, int]]) -> list[_Gpu]:
        """The free GPUs outside ``excluded`` as empty places, those of the fullest nodes first (a pair there
        leaves the larger blocks of free GPUs to gangs)."""
        keys = [k for k in self.free if k not in excluded]
        per_node: dict[str, int] = {}
        for n, _ in keys:
            per_node[n] = per_node.get(n, 0) + 1
        keys.sort(key=lambda k: (per_node[k[0]], k))
        return [_Gpu(((n, (i,)),), self.devices[n, i].model, self.devices[n, i].memory_mib, []) for n, i in keys]

    def room(self, job: SchedJob, gpu: _Gpu, max_jobs: int) -> bool:
        req = job.request
        if req.gpu_model and gpu.model != req.gpu_model or len(gpu.jobs) >= max_jobs or not gpu.fits_shape(job):
            return False
        per_node: dict[str, int] = {}
        for n, _ in gpu.layout:
            per_node[n] = per_node.get(n, 0) + 1
        for n, k in per_node.items():
            if self.cpu[n] + 1e-9 < k * req.cpu or self.mem[n] < k * req.memory_mib:
                return False
        used = sum(j.request.gpu_memory_mib or 0 for j in gpu.jobs)
        return used + (req.gpu_memory_mib or 0) <= gpu.memory_mib

    def take(self, job: SchedJob, gpu: _Gpu) -> tuple[Allocation, ...]:
        out = []
        for n, g in gpu.layout:
            self.cpu[n] -= job.request.cpu
            self.mem[n] -= job.request.memory_mib
            out.append(Allocation(n, g, job.request.cpu, job.request.memory_mib))
        gpu.jobs.append(job)
        return tuple(out)

    def _use(self, allocations: tuple[Allocation, ...]) -> None:
        for a in allocations:
            if a.node in self.cpu:
                self.cpu[a.node] -= a.cpu
                self.mem[a.node] -= a.memory_mib

    def hold(self, allocations: tuple[Allocation, ...]) -> None:
        """Count a start made outside the sharing pass (an inner start that stayed where it was): its GPUs are
        not free and its CPU and memory are used."""
        self._use(allocations)
        taken = {(a.node, g) for a in allocations for g in a.gpus}
        self.free = [k for k in self.free if k not in taken]

    def give_back(self, job: SchedJob, gpu: _Gpu) -> None:
        """Undo :meth:`take`."""
        for n, _ in gpu.layout:
            self.cpu[n] += job.request.cpu
            self.mem[n] += job.request.memory_mib
        gpu.jobs.remove(job)


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


@dataclass(slots=True)
class _Judge:
    """Judges one candidate GPU for one job and remembers, for the job's ``why``, the closest miss."""

    info: SharingInfo
    queues: Mapping[str, QueueConfig]
    aware: bool
    job: SchedJob
    miss: str = ""
    miss_by: float = float("inf")  # how far past its tolerance the closest refused mix was
    unknown: str = ""

    def gain(self, gpu: _Gpu) -> float | None:
        """How much the GPU's predicted normalised throughput grows with the job on it; None when a job of the new
        mix would decay past its tolerance, or the mix is unknown."""
        if not self.aware:
            return 1.0 / (1 + len(gpu.jobs))
        info, job = self.info, self.job
        if info.unavailable:
            self.unknown = info.unavailable
            return None
        before = info.predicted(gpu.model, gpu.jobs)
        after = info.predicted(gpu.model, [*gpu.jobs, job])
        if before is None or after is None:
            others = ", ".join(j.id for j in gpu.jobs)
            if job.id not in info.workload:
                self.unknown = "it names no profiled workload (spec field workload), so its slowdown is unknown"
            elif not self.unknown:
                self.unknown = f"no predicted slowdown for it next to {others} on {gpu.model} (not profiled)"
            return None
        by_id = {j.id: j for j in (*gpu.jobs, job)}
        excess = {i: d - info.tolerance(by_id[i], self.queues) for i, d in after.items()}
        worst = max(excess, key=lambda i: excess[i])
        if excess[worst] > 0:
            if excess[worst] < self.miss_by:
                self.miss_by = excess[worst]
                who = "it" if worst == job.id else worst
                self.miss = (
                    f"next to {', '.join(j.id for j in gpu.jobs)} on {gpu.where} the predicted slowdown of {who} is "
                    f"{_pct(after[worst])}, over its tolerance {_pct(info.tolerance(by_id[worst], self.queues))}"
                )
            return None
        return sum(1.0 - d for d in after.values()) - sum(1.0 - d for d in before.values())

    def note(self, gpu: _Gpu) -> str:
        """The Scheduled event's explanation of a shared start on ``gpu`` (before the job joins it)."""
        others = ", ".join(j.id for j in gpu.jobs)
        if not self.aware:
            return f"shares {gpu.where} with {others} (naive packing: the memory requests fit)"
        after = self.info.predicted(gpu.model, [*gpu.jobs, self.job]) or {}
        by_id = {j.id: j for j in (*gpu.jobs, self.job)}
        tol = {i: self.info.tolerance(j, self.queues) for i, j in by_id.items()}
        parts = [f"{'it' if i == self.job.id else i} {_pct(d)} (tolerance {_pct(tol[i])})" for i, d in after.items()]
        return f"shares {gpu.where} with {others}; predicted slowdown: {', '.join(parts)}"

    def reason(self, candidates: int) -> Reason:
        if self.miss:
            msg = f"not shared: {self.miss}"
        elif self.unknown:
            msg = f"not shared: {self.unknown}"
        elif not candidates:
            msg = "not shared: no GPU used only by shareable jobs has room for its GPU memory, CPU and memory"
        else:
            msg = "not shared: no GPU where sharing raises the predicted throughput"
        return Reason(SHARING_DECLINED, msg, {"tolerance": self.info.tolerance(self.job, self.queues)})


@dataclass(slots=True)
class Placements:
    starts: list[Start]  # on shared GPUs
    moved: set[str]  # ids whose inner start (on a free GPU) these replace
    declined: dict[str, Reason]  # shareable jobs left waiting, and why they were not shared


def _alike(job: SchedJob, info: SharingInfo, queues: Mapping[str, QueueConfig]) -> tuple[object, ...]:
    """What decides where a job may share and what it gains there: jobs alike judge alike."""
    return (info.workload.get(job.id), info.tolerance(job, queues), job.request, job.replicas)


def _first_blocked(snap: Snapshot, decisions: Decisions) -> SchedJob | None:
    """The first waiting job (in queue order) that needs whole GPUs and waits for capacity only."""
    started = {s.job_id for s in decisions.starts}
    for job in sorted(snap.queued, key=lambda j: (j.waiting_since, j.id)):
        if job.id in started or not job.gpus or can_share(job):
            continue
        if all(r.code in CAPACITY_CODES for r in decisions.pending.get(job.id, ())):
            return job
    return None


def drain_set(snap: Snapshot, decisions: Decisions) -> frozenset[tuple[str, int]]:
    """The GPUs the first blocked exclusive job will start on: per replica, the node and GPUs with the fewest jobs
    to finish first (free ones cost nothing), ties by node order. A job that joined one of them would hold it
    past its occupant's end (and a GPU whose partner leaves takes the next), so a gang behind a stream of
    co-runners would never start; keeping them partner-free lets them drain as in exclusive scheduling."""
    job = _first_blocked(snap, decisions)
    if job is None:
        return frozenset()
    req = job.request
    held: dict[tuple[str, int], int] = {}
    placed = [a for j in snap.running for a in j.allocations] + [a for s in decisions.starts for a in s.allocations]
    for a in placed:
        for g in a.gpus:
            held[(a.node, g)] = held.get((a.node, g), 0) + 1
    out: set[tuple[str, int]] = set()
    for _ in range(job.replicas):
        best: tuple[int, list[tuple[str, int]]] | None = None
        for n in snap.nodes:
            if not n.schedulable or n.cpu < req.cpu or n.memory_mib < req.memory_mib:
                continue
            keys = [(n.name, d.index) for d in n.gpus if not req.gpu_model or d.model == req.gpu_model]
            keys = sorted((k for k in keys if k not in out), key=lambda k: held.get(k, 0))[: req.gpu]
            cost = sum(held.get(k, 0) for k in keys)
            if len(keys) == req.gpu and (best is None or cost < best[0]):
                best = (cost, keys)
        if best is None:
            return frozenset()  # it can never fit: nothing to drain for
        out.update(best[1])
    return frozenset(out)


def _free_gpu_pairs(
    occ: _Occupancy, waiting: list[SchedJob], judges: dict[str, _Judge], reserved: frozenset[tuple[str, int]]
) -> Iterator[Start]:
    """Starts that open free GPUs outside ``reserved`` to pairs of ``waiting`` jobs: the earliest job that has a
    partner within every tolerance, with the partner that gains most (the earliest of each workload is judged)."""
    free, left = occ.free_gpus(reserved), list(waiting)
    no_partner: set[tuple[str | None, float]] = set()
    while free and left:
        first, gpu = left.pop(0), free[0]
        judge = judges[first.id]
        key = (judge.info.workload.get(first.id), judge.info.tolerance(first, judge.queues))
        if key in no_partner or not occ.room(first, gpu, judge.info.max_jobs_per_gpu):
            continue
        allocations = occ.take(first, gpu)
        partner = _best_partner(occ, gpu, left, judges, _pair_bar(judge.info))
        if partner is None:
            occ.give_back(first, gpu)
            no_partner.add(key)
            continue
        left.remove(partner)
        free.pop(0)
        note = judges[partner.id].note(gpu)
        yield Start(partner.id, occ.take(partner, gpu), note)
        yield Start(first.id, allocations, f"opens {gpu.where} (free, not held for the first blocked job) with {note}")


def _pair_bar(info: SharingInfo) -> float:
    return info.min_gain if info.prefer_gain is None else info.prefer_gain


def _best_partner(
    occ: _Occupancy, gpu: _Gpu, waiting: list[SchedJob], judges: dict[str, _Judge], min_gain: float
) -> SchedJob | None:
    """The waiting job that gains most next to ``gpu``'s job, above ``min_gain``; the earliest of each workload."""
    best: tuple[float, SchedJob] | None = None
    judged: set[tuple[str | None, float]] = set()
    for job in waiting:
        judge = judges[job.id]
        key = (judge.info.workload.get(job.id), judge.info.tolerance(job, judge.queues))
        if key in judged or not occ.room(job, gpu, judge.info.max_jobs_per_gpu):
            continue
        judged.add(key)
        gain = judge.gain(gpu)
        if gain is not None and gain > min_gain + 1e-12 and (best is None or gain > best[0] + 1e-12):
            best = (gain, job)
    return None if best is None else best[1]


def share_placements(snap: Snapshot, decisions: Decisions, aware: bool = True) -> Placements:
    """Starts on shared GPUs for queued shareable jobs the inner policy's ``decisions`` left waiting, and (with
    ``SharingInfo.prefer_gain``) for shareable jobs it started on a free GPU that gain enough by sharing instead.

    The movable jobs go first, in queue order. The waiting ones are then placed best pair first among the first
    ``SharingInfo.match_window`` of them (the (job, GPU) with the largest predicted gain, then the next, ...), so
    an early job does not take the partner a later one would have gained more with; 1 is plain queue order.
    With ``SharingInfo.drain_for_blocked`` no job joins a GPU of :func:`drain_set`."""
    out = Placements([], set(), {})
    info = snap.sharing
    if info is None:
        return out
    inner = {s.job_id: s for s in decisions.starts}
    queued = {j.id: j for j in snap.queued}
    movable = {i for i in inner if aware and info.prefer_gain is not None and i in queued and can_share(queued[i])}
    order = sorted(snap.queued, key=lambda j: (j.id not in movable, j.waiting_since, j.id))
    barrier = float("inf")
    if aware and info.keep_order:
        barrier = min(
            (j.waiting_since for j in snap.queued if j.id not in inner and j.gpus and not can_share(j)), default=barrier
        )
    candidates: list[SchedJob] = []
    for job in order:
        if job.id not in movable and job.waiting_since > barrier:
            continue
        if job.id in inner and job.id not in movable or not can_share(job):
            continue
        if any(r.code not in CAPACITY_CODES for r in decisions.pending.get(job.id, ())):
            continue
        candidates.append(job)
    if not candidates:
        return out
    occ = _Occupancy(snap, [st for st in decisions.starts if st.job_id not in movable])
    reserved: frozenset[tuple[str, int]] | None = None
    if aware and info.drain_for_blocked:
        reserved = drain_set(snap, decisions)
        occ.gpus = [g for g in occ.gpus if not any((n, i) in reserved for n, gs in g.layout for i in gs)]
    judges = {j.id: _Judge(info, snap.queues, aware, j) for j in candidates}
    rooms: dict[str, int] = {}

    def best_for(job: SchedJob) -> tuple[float, _Gpu | None]:
        judge, room = judges[job.id], 0
        best, best_gain = None, info.prefer_gain if job.id in movable else (info.min_gain if aware else 0.0)
        for gpu in occ.gpus:
            if occ.room(job, gpu, info.max_jobs_per_gpu):
                room += 1
                gain = judge.gain(gpu)
                if gain is not None and gain > best_gain + 1e-12:  # type: ignore[operator]
                    best, best_gain = gpu, gain
        rooms[job.id] = max(rooms.get(job.id, 0), room)
        return best_gain or 0.0, best

    def place(job: SchedJob, gpu: _Gpu) -> None:
        note = judges[job.id].note(gpu)
        out.starts.append(Start(job.id, occ.take(job, gpu), note))
        if job.id in movable:
            out.moved.add(job.id)

    for job in candidates:
        if job.id in movable and (gpu := best_for(job)[1]) is not None:
            place(job, gpu)
    for start_id in movable - out.moved:  # not moved: it starts where the inner policy put it
        occ.hold(inner[start_id].allocations)
    waiting = [j for j in candidates if j.id not in movable]
    k = max(1, info.match_window) if aware else 1
    pool, rest = waiting[:k], waiting[k:]
    while pool:
        best: tuple[float, SchedJob, _Gpu] | None = None
        seen: set[tuple[object, ...]] = set()
        for job in pool:
            if (key := _alike(job, info, snap.queues)) in seen:
                continue  # judged as an earlier job of the pool that asks for the same: no better than it
            seen.add(key)
            gain, gpu = best_for(job)
            if gpu is not None and (best is None or gain > best[0] + 1e-12):
                best = (gain, job, gpu)
        if best is None:
            break
        place(best[1], best[2])
        pool.remove(best[1])
    for job in rest:
        if (gpu := best_for(job)[1]) is not None:
            place(job, gpu)
    placed = {s.job_id for s in out.starts}
    if reserved is not None and info.pair_on_free:
        one_gpu = [j for j in waiting if j.id not in placed and j.gpus == 1]
        out.starts += _free_gpu_pairs(occ, one_gpu, judges, reserved)
        placed = {s.job_id for s in out.starts}
    for job in candidates:
        if job.id not in placed and job.id not in inner and snap.explain:
            if job.id not in rooms:  # skipped as alike an earlier job: judge it now, for its own why
                best_for(job)
            out.declined[job.id] = judges[job.id].reason(rooms.get(job.id, 0))
    return out


class _Pending(LazyPending):
    """The inner policy's pending reasons without the jobs sharing started, with the sharing reasons added (lazy,
    like :class:`~caldera.scheduler.reasons.PendingReasons`: nothing is built for the jobs nobody reads)."""

    def __init__(self, inner: Mapping[str, list[Reason]], started: set[str], added: dict[str, Reason]) -> None:
        self._inner, self._started, self._added = inner, started, added

    def __getitem__(self, job_id: str) -> list[Reason]:
        if job_id in self._started:
            raise KeyError(job_id)
        reasons = self._inner[job_id]
        extra = self._added.get(job_id)
        return reasons if extra is None else [extra, *reasons]

    def __iter__(self) -> Iterator[str]:
        return (k for k in self._inner if k not in self._started)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def specific(self) -> Iterator[tuple[str, Sequence[Reason]]]:
        started, added = self._started, self._added
        for job_id, reasons in specific_reasons(self._inner):
            if job_id not in started:
                extra = added.get(job_id)
                yield job_id, reasons if extra is None else [extra, *reasons]

    def said(self) -> tuple[dict[str, Sequence[Reason]], set[str]] | None:
        inner = said_reasons(self._inner)
        if inner is None:
            return None
        said, left_out = inner
        left_out = left_out | self._started
        out = {job_id: reasons for job_id, reasons in said.items() if job_id not in left_out}
        for job_id, extra in self._added.items():  # jobs of the snapshot's queue, pending where not left out
            if job_id not in left_out:
                out[job_id] = [extra, *out.get(job_id, ())]
        return out, left_out


class SharingPolicy:
    """``inner`` plus sharing (see the module docstring). ``aware=False`` is naive packing."""

    def __init__(self, inner: Policy, *, aware: bool = True) -> None:
        self.inner = inner
        self.aware = aware
        self.name = f"{inner.name}+{'share' if aware else 'pack'}"

    def __call__(self, snap: Snapshot, /) -> Decisions:
        d = self.inner(snap)
        placed = share_placements(snap, d, self.aware)
        if not placed.starts and not placed.declined:
            return d
        ids = {s.job_id for s in placed.starts}
        pending = _Pending(d.pending, ids, placed.declined)
        if not placed.starts:
            return Decisions(d.starts, d.preemptions, pending, wake_at=d.wake_at)
        starts = [s for s in d.starts if s.job_id not in placed.moved] + placed.starts
        # a start changes what the inner policy may do next (e.g. FIFO's blocked head now runs, or a GPU a job
        # would have taken is free after all): call again soon
        return Decisions(starts, d.preemptions, pending, wake_at=snap.now)
