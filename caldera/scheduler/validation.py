"""Checking a policy's decisions against the snapshot they came from, before anything is applied.

A policy is trusted to be right, but a wrong start would double-book a GPU, and a wrong preemption would stop a job
for nothing, so the live loop and the simulator both check every decision first and drop the bad ones. Each rule has
one implementation here: :class:`FreeCapacity` holds what is free per node and judges one start against it, and
:func:`preemption_problem` judges one preemption. :func:`decision_errors` runs them over a whole cycle from a
snapshot; the simulator keeps one :class:`FreeCapacity` up to date between cycles instead of rebuilding it.

Starts are judged against the capacity that is free in the snapshot: a preemption's victim still holds its GPUs
until it has stopped, so nothing may start on them in the same cycle.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from operator import attrgetter

from caldera.core.cluster import Allocation, Node
from caldera.scheduler.sharing import can_share
from caldera.scheduler.snapshot import Decisions, Preempt, SchedJob, Snapshot, Start

_ID = attrgetter("id")
_CPU_SLACK = 1e-6  # CPU is fractional: sums of floats may exceed a node's CPU by rounding only


@dataclass(slots=True, frozen=True)
class Problem:
    """One decision that cannot be applied. ``kind`` is stable (``start_busy``, ``preempt_not_running``, ...)."""

    kind: str
    job_id: str
    message: str


class FreeCapacity:
    """Free GPU indices, CPU and memory per schedulable node."""

    __slots__ = ("gpus", "cpu", "memory", "models")

    def __init__(self, nodes: Iterable[Node], running: Iterable[SchedJob] = ()) -> None:
        self.gpus: dict[str, set[int]] = {}
        self.cpu: dict[str, float] = {}
        self.memory: dict[str, int] = {}
        self.models: dict[str, dict[int, str]] = {}
        for n in nodes:
            if n.schedulable:
                self.gpus[n.name] = {d.index for d in n.gpus}
                self.cpu[n.name] = n.cpu
                self.memory[n.name] = n.memory_mib
                self.models[n.name] = {d.index: d.model for d in n.gpus}
        for j in running:
            self.take(a for a in j.allocations if a.node in self.gpus)

    def take(self, allocations: Iterable[Allocation]) -> None:
        for a in allocations:
            self.gpus[a.node].difference_update(a.gpus)
            self.cpu[a.node] -= a.cpu
            self.memory[a.node] -= a.memory_mib

    def give(self, allocations: Iterable[Allocation]) -> None:
        for a in allocations:
            if a.node in self.gpus:
                self.gpus[a.node].update(a.gpus)
                self.cpu[a.node] += a.cpu
                self.memory[a.node] += a.memory_mib

    def start_problem(
        self, start: Start, queued: Mapping[str, SchedJob], shared: SharedGpus | None = None
    ) -> Problem | None:
        """Why ``start`` cannot be applied now (None: it can), given the jobs still ``queued`` (a started one is
        no longer). A GPU in use is acceptable only where ``shared`` admits the job next to its users. Takes
        nothing: a gang is judged whole."""
        jid = start.job_id
        job = queued.get(jid)
        if job is None:
            return Problem("start_not_queued", jid, f"start of {jid}, which is not queued (or started twice)")
        allocations = start.allocations
        req = job.request
        if len(allocations) != job.replicas:
            msg = f"start of {jid} has {len(allocations)} allocations for {job.replicas} replicas"
            return Problem("start_replicas", jid, msg)
        need: dict[str, list[float]] = {}
        used: set[tuple[str, int]] = set()
        models: set[str] = set()
        for a in allocations:
            free = self.gpus.get(a.node)
            if free is None:
                return Problem("start_node", jid, f"start of {jid} on unknown or unschedulable node {a.node}")
            if len(a.gpus) != req.gpu or len(set(a.gpus)) != req.gpu:
                msg = f"start of {jid} gives {len(a.gpus)} GPUs per replica, wants {req.gpu}"
                return Problem("start_gpus", jid, msg)
            acc = need.setdefault(a.node, [0.0, 0.0])
            acc[0] += a.cpu
            acc[1] += a.memory_mib
            node_models = self.models[a.node]
            for g in a.gpus:
                busy = g not in free and (shared is None or not shared.admits(job, a.node, g))
                if busy or (a.node, g) in used:
                    return Problem("start_busy", jid, f"start of {jid} on {a.node} GPU {g}, which is not free")
                used.add((a.node, g))
                models.add(node_models[g])
        if shared is not None and not shared.same_partners(allocations):
            msg = f"start of {jid} shares its GPUs with different jobs: every GPU of a shared start holds the same"
            return Problem("start_shared_partners", jid, msg)
        if req.gpu_model and not models <= {req.gpu_model}:
            return Problem("start_model", jid, f"start of {jid} on {sorted(models)} GPUs, not {req.gpu_model}")
        if len(models) > 1:  # replicas of one job run at one speed: the slowest model would hold the rest back
            return Problem("start_model", jid, f"start of {jid} spans GPU models {sorted(models)}")
        for name, (cpu, mem) in need.items():
            if self.cpu[name] + _CPU_SLACK < cpu or self.memory[name] < mem:
                return Problem("start_cpu_memory", jid, f"start of {jid} over-commits CPU or memory on {name}")
        return None


class SharedGpus:
    """Who holds each GPU, for judging starts on GPUs in use (a snapshot with ``sharing``): the rules of
    caldera/scheduler/sharing.py that keep co-location safe, whichever policy decided it -- every job on the GPU
    and the newcomer shareable, none stopping, room for one more, and the GPU-memory requests within the device's."""

    def __init__(self, snapshot: Snapshot, max_jobs: int) -> None:
        self.max_jobs = max_jobs
        self.memory = {(n.name, d.index): d.memory_mib for n in snapshot.nodes for d in n.gpus}
        self.holders: dict[tuple[str, int], list[SchedJob]] = {}
        for j in snapshot.running:
            self.add(j, j.allocations)

    def add(self, job: SchedJob, allocations: Iterable[Allocation]) -> None:
        for a in allocations:
            for g in a.gpus:
                self.holders.setdefault((a.node, g), []).append(job)

    def same_partners(self, allocations: Iterable[Allocation]) -> bool:
        """Whether every GPU of a start holds the same jobs (none, or all ranks next to the same partners): a job
        slowed on one GPU holds back all its ranks, which the decay model predicts only for one partner mix."""
        mixes = {frozenset(h.id for h in self.holders.get((a.node, g), ())) for a in allocations for g in a.gpus}
        return len(mixes) <= 1

    def admits(self, job: SchedJob, node: str, gpu: int) -> bool:
        holders = self.holders.get((node, gpu), [])
        if not holders or not can_share(job) or len(holders) >= self.max_jobs:
            return False
        if not all(can_share(h) and not h.terminating for h in holders):
            return False
        used = sum(h.request.gpu_memory_mib or 0 for h in holders)
        return used + (job.request.gpu_memory_mib or 0) <= self.memory.get((node, gpu), 0)


def preemption_problem(pre: Preempt, running: Mapping[str, SchedJob], seen: set[str]) -> Problem | None:
    """Why ``pre`` cannot be applied (None: it can); ``seen`` holds the jobs already preempted in this cycle."""
    jid = pre.job_id
    job = running.get(jid)
    if job is None:
        return Problem("preempt_not_running", jid, f"preemption of {jid}, which is not running")
    if job.terminating or jid in seen:
        return Problem("preempt_terminating", jid, f"preemption of {jid}, which is already stopping")
    if not pre.reason or not pre.message:
        return Problem("preempt_unexplained", jid, f"preemption of {jid} without a reason and message")
    return None


def _split(snapshot: Snapshot, decisions: Decisions) -> tuple[list[Start], list[Preempt], list[Problem]]:
    """The valid starts and preemptions of ``decisions``, and the problems of the others."""
    problems: list[Problem] = []
    free = FreeCapacity(snapshot.nodes, snapshot.running)
    # by id, for the starts only: a pass over a long queue in C where some job starts, none where none does
    queued = dict(zip(map(_ID, snapshot.queued), snapshot.queued)) if decisions.starts else {}
    shared = None if snapshot.sharing is None else SharedGpus(snapshot, snapshot.sharing.max_jobs_per_gpu)
    starts: list[Start] = []
    for st in decisions.starts:
        job = queued.get(st.job_id)
        p = free.start_problem(st, queued, shared)
        if p is None:
            if shared is not None and job is not None:
                shared.add(job, st.allocations)
            free.take(st.allocations)
            del queued[st.job_id]
            starts.append(st)
        else:
            problems.append(p)
    running = {j.id: j for j in snapshot.running}
    seen: set[str] = set()
    preemptions: list[Preempt] = []
    for pre in decisions.preemptions:
        p = preemption_problem(pre, running, seen)
        if p is None:
            seen.add(pre.job_id)
            preemptions.append(pre)
        else:
            problems.append(p)
    return starts, preemptions, problems


def _explanation_problems(snapshot: Snapshot, decisions: Decisions) -> list[Problem]:
    """With ``snapshot.explain``, every queued job that does not start has at least one reason."""
    if not snapshot.explain:
        return []
    started = {st.job_id for st in decisions.starts}
    out = []
    for j in snapshot.queued:
        reasons = decisions.pending.get(j.id)
        if j.id in started:
            if reasons:
                out.append(Problem("pending_started", j.id, f"{j.id} starts and has pending reasons"))
        elif not reasons or not all(r.code and r.message for r in reasons):
            out.append(Problem("pending_missing", j.id, f"{j.id} does not start and has no reason (or an empty one)"))
    return out


def decision_errors(snapshot: Snapshot, decisions: Decisions) -> list[Problem]:
    """Everything wrong with ``decisions`` for ``snapshot``; empty when all of it can be applied."""
    return _split(snapshot, decisions)[2] + _explanation_problems(snapshot, decisions)


def valid_decisions(snapshot: Snapshot, decisions: Decisions) -> tuple[Decisions, list[Problem]]:
    """``decisions`` without the starts and preemptions that cannot be applied, and their problems. Pending reasons
    are not read (a job without one still waits correctly, and reading them all costs time on a long queue)."""
    starts, preemptions, problems = _split(snapshot, decisions)
    if len(starts) == len(decisions.starts) and len(preemptions) == len(decisions.preemptions):
        return decisions, problems
    return replace(decisions, starts=starts, preemptions=preemptions), problems
