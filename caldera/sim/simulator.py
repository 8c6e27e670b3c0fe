"""Event-driven replay of a trace through a scheduling policy.

The policy is the same callable the live loop uses (``Snapshot -> Decisions``). Each scheduling cycle builds a
:class:`Snapshot` from state the simulator keeps up to date incrementally (queued and running jobs in insertion-ordered
dicts, per-node free GPUs, decayed usage), calls the policy and applies its decisions. The snapshot carries the
free-capacity index the simulator maintains (``Snapshot.capacity``: policies copy it instead of rebuilding it from the
running jobs) and says that no pending reasons are wanted (``explain=False``); neither changes a decision.

* ``Start``: the job runs on the given allocations for its remaining work; a completion event is queued.
* ``Preempt``: the victim stops (after ``preempt_grace_s``, during which it keeps its resources and is
  ``terminating``), goes back to the queue with its remaining work preserved (checkpoint/resume: the work done up to
  the preemption request is kept, plus ``restart_overhead_s`` on resume) and its GPU-seconds added to
  ``attained_gpu_s``.

Cycles run once per batch of simultaneous events (arrivals, completions, releases) and, while jobs wait, every
``tick_s`` simulated seconds so time-based rules (starvation, reservations, least-attained-service) progress. With
``wake_hints`` (the default) a periodic cycle is skipped until the time the policy's last ``Decisions.wake_at`` names:
the policy has said that no such cycle before then could start or preempt anything, so the replay is the same, only
faster (FIFO never needs one; Tiresias wakes when a running job crosses into a lower-priority level). Nothing runs
while the queue is empty and nothing happens. Jobs that could not fit the empty cluster are dropped and counted. If
the cluster is idle, no event is left and ``stuck_ticks`` cycles in a row start nothing (for instance a quota caps a
queue below a job's size), or the policy says only an event could change that, the replay stops and the queued jobs
are reported as unfinished.
"""

from __future__ import annotations

import gc
import heapq
import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from caldera.core.cluster import Allocation, Node
from caldera.core.resources import GPU, Resources
from caldera.core.tenancy import QueueConfig, Quota
from caldera.scheduler.placement import ClusterIndex
from caldera.scheduler.snapshot import Decisions, Policy, SchedJob, Snapshot, Start
from caldera.scheduler.validation import FreeCapacity, Problem, preemption_problem
from caldera.sim.cluster import ClusterSpec
from caldera.sim.failures import NodeFailures
from caldera.sim.history import RuntimeHistory
from caldera.sim.traces import TraceJob, _account

log = logging.getLogger("caldera.sim")

DEFAULT_HALF_LIFE_S = 7 * 24 * 3600.0

_COMPLETE, _RELEASE, _NODE_DOWN, _NODE_UP = 0, 1, 2, 3
# Policies may leave reference cycles behind every cycle (thousands with a long queue); the automatic collector
# would rescan all live job objects again and again. Instead, with automatic collection off during a replay, the
# young generations are collected once this many objects have piled up, or every _GC_CYCLES cycles (bounded memory,
# amortised cost), and everything every 50th time.
_GC_OBJECTS = 2_000_000
_GC_CYCLES = 500
_MAX_SAME_INSTANT = 8
_HAS_PREEMPTED_BY = "preempted_by" in getattr(SchedJob, "__dataclass_fields__", {})


class SimulationError(RuntimeError):
    """A policy decision the simulator cannot apply (raised only with ``strict=True``)."""


def _local_decay_factor(elapsed_s: float, half_life_s: float | None) -> float:
    if elapsed_s <= 0 or half_life_s is None or half_life_s <= 0 or math.isinf(half_life_s):
        return 1.0
    return 0.5 ** (elapsed_s / half_life_s)


def _decay_factor_function() -> Callable[[float, float | None], float]:
    """``caldera.scheduler.fairshare.decay_factor`` when that module exists (so the simulator ages usage exactly as
    the live loop does), else a local half-life decay."""
    try:
        from caldera.scheduler import fairshare
    except ImportError:
        return _local_decay_factor
    fn = getattr(fairshare, "decay_factor", None)
    return fn if callable(fn) else _local_decay_factor


def advance_usage(
    usage: dict[str, float],
    gpus: dict[str, int],
    elapsed_s: float,
    half_life_s: float | None,
    factor: Callable[[float, float | None], float] = _local_decay_factor,
) -> dict[str, float]:
    """Decay ``usage`` over ``elapsed_s`` and charge ``gpus[k]`` GPUs held throughout, integrating the decay exactly
    (``g * h/ln2 * (1 - 2**(-elapsed/h))``, about ``g * elapsed`` for short intervals), as
    ``fairshare.advance`` does, but from per-key GPU counts kept up to date by the simulator instead of a scan of the
    running jobs."""
    if elapsed_s <= 0:
        return usage
    f = factor(elapsed_s, half_life_s)
    if f == 1.0:
        out = dict(usage)
        w = elapsed_s
    else:
        out = {k: v * f for k, v in usage.items()}
        w = half_life_s / _LN2 * (1.0 - f)  # type: ignore[operator]
    for k, g in gpus.items():
        if g:
            out[k] = out.get(k, 0.0) + g * w
    return out


_LN2 = math.log(2.0)


# --------------------------------------------------------------------------------------------------- queues
def default_queues(jobs: Iterable[TraceJob], total_gpus: int, share: str = "demand") -> dict[str, QueueConfig]:
    """One queue per account (named after it), with no caps. ``share`` sets each queue's GPU ``deserved`` share:
    ``demand`` (proportional to the account's GPU-seconds in the trace; weight likewise, averaging 1), ``equal``
    (``total_gpus / accounts``) or ``none`` (no quota at all)."""
    demand: dict[str, float] = {}
    for j in jobs:
        a = _account(j.account)
        demand[a] = demand.get(a, 0.0) + max(j.gpu_seconds, 0.0)
    if not demand:
        return {}
    n = len(demand)
    total = sum(demand.values())
    out: dict[str, QueueConfig] = {}
    for acct, d in sorted(demand.items()):
        if share == "none":
            out[acct] = QueueConfig(name=acct, account=acct)
            continue
        if share == "equal" or total <= 0:
            frac = 1.0 / n
        elif share == "demand":
            frac = d / total
        else:
            raise ValueError(f"share must be demand, equal or none, not {share!r}")
        weight = max(frac * n, 1e-6)
        out[acct] = QueueConfig(name=acct, account=acct, weight=weight, quotas={GPU: Quota(deserved=total_gpus * frac)})
    return out


def load_queue_file(path: str | Path) -> list[QueueConfig]:
    """Queue configs from JSON or YAML: a list of :class:`QueueConfig` objects or ``{"queues": [...]}``."""
    import json

    import yaml

    path = Path(path)
    text = path.read_text()
    data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    if isinstance(data, dict):
        data = data.get("queues", data)
        if isinstance(data, dict):  # {name: {...}}
            data = [{"name": k, **v} for k, v in data.items()]
    return [QueueConfig.model_validate(q) for q in data]


# --------------------------------------------------------------------------------------------------- state
class SimJob:
    """Simulator-side state of one job, wrapping the :class:`SchedJob` the policy sees."""

    __slots__ = (
        "trace",
        "sj",
        "remaining_s",
        "first_start",
        "finish",
        "attempt",
        "preemptions",
        "run_start",
        "base_attained",
        "gpus",
        "preempt_at",
        "estimate",
        "speed",
    )

    def __init__(self, trace: TraceJob, sj: SchedJob) -> None:
        self.trace = trace
        self.sj = sj
        self.remaining_s = trace.duration_s
        self.first_start: float | None = None
        self.finish: float | None = None
        self.attempt = 0
        self.preemptions = 0
        self.run_start: float | None = None
        self.base_attained = 0.0
        self.gpus = sj.gpus
        self.preempt_at: float | None = None
        self.estimate: float | None = None  # run time expected at submission (from the user's history)
        self.speed = 1.0  # work done per second in the current attempt (GPU type, locality)


@dataclass(slots=True)
class SimOptions:
    tick_s: float | None = 60.0  # periodic cycle while jobs wait; None/0: only on events
    wake_hints: bool = True  # skip the periodic cycles that Decisions.wake_at says change nothing
    cycle_quantum_s: float = 0.0  # > 0: cycles only on multiples of this (events in between batch up)
    half_life_s: float = DEFAULT_HALF_LIFE_S
    preempt_grace_s: float = 0.0
    restart_overhead_s: float = 0.0
    share: str = "demand"
    queues: list[QueueConfig] | None = None
    strict: bool = False  # raise on decisions that cannot be applied (else count and skip)
    max_time_s: float | None = None  # stop the replay at this simulated time
    stuck_ticks: int = 3
    runtime_estimate: float | None = None  # >= 1: queued jobs get max_runtime_s = remaining work x this (1 = an
    # exact oracle, for backfill/reservations); None: unknown
    runtime_history: bool = True  # queued jobs get expected_runtime_s from their user's finished jobs
    locality_slowdown: float = 0.0  # a gang spread over more nodes than it needs runs this much slower (0.2:
    # 20 %), unless the trace measured that case (Gavel's *_unconsolidated throughputs)
    node_failures: tuple[tuple[float, str, float], ...] = ()  # (time, node, repair time) in trace seconds
    node_mtbf_s: float | None = None  # or: each node fails after exponential times of this mean (seeded)
    node_repair_s: float = 3600.0  # how long a node drawn to fail stays down
    failure_seed: int = 0
    checkpoint_interval_s: float = 3600.0  # jobs killed by a failure lose the work since their last checkpoint
    cpu_per_gpu: float | None = None  # per-GPU CPU/memory of jobs whose trace has none; default: the
    memory_mib_per_gpu: int | None = None  # cluster's scarcest ratio, so only GPUs constrain


@dataclass(slots=True)
class SimResult:
    policy: str
    cluster: ClusterSpec
    jobs: list[SimJob]
    dropped: list[TraceJob]  # could never fit the cluster
    not_arrived: int  # arrivals after max_time_s
    end_time: float
    alloc_t: list[float]
    alloc_gpus: list[int]
    queue_t: list[float]
    queue_len: list[int]
    total_gpus: int
    cycles: int = 0
    tick_cycles: int = 0  # of which periodic (no event)
    policy_s: float = 0.0
    wall_s: float = 0.0
    preemptions_by_reason: dict[str, int] = field(default_factory=dict)
    invalid_decisions: dict[str, int] = field(default_factory=dict)
    stopped: str = "done"
    same_instant_capped: int = 0  # cycles not run at an instant that had already had _MAX_SAME_INSTANT
    preempt_t: list[float] = field(default_factory=list)  # when each applied preemption was decided
    node_failures: int = 0
    failure_kills: int = 0  # job attempts killed by node failures (re-queued)


@dataclass(slots=True, frozen=True)
class SimProgress:
    """Where a replay is, for progress displays."""

    now_s: float  # simulated time
    last_arrival_s: float  # simulated time of the trace's last submission
    finished: int  # jobs completed
    total: int  # jobs that will be simulated
    queued: int
    running: int
    cycles: int
    wall_s: float


PROGRESS_EVERY_S = 0.5  # wall seconds between progress callbacks


class Simulator:
    """Replays ``jobs`` on ``cluster`` under ``policy``. :meth:`run` returns a :class:`SimResult`; ``progress``,
    when given, is called about every ``PROGRESS_EVERY_S`` wall seconds and once at the end."""

    def __init__(
        self,
        jobs: Iterable[TraceJob],
        cluster: ClusterSpec,
        policy: Policy,
        options: SimOptions | None = None,
        progress: Callable[[SimProgress], None] | None = None,
    ) -> None:
        self.opt = options or SimOptions()
        self.progress = progress
        if self.opt.runtime_estimate is not None and self.opt.runtime_estimate < 1.0:
            raise ValueError("runtime_estimate must be >= 1 (the simulator does not kill jobs at max_runtime_s)")
        self.cluster = cluster
        self.policy = policy
        self.policy_name = getattr(policy, "name", type(policy).__name__)
        self.nodes: list[Node] = cluster.build()
        self.total_gpus = cluster.total_gpus
        gpn = cluster.max_gpus_per_node
        cpg, mpg = cluster.cpu_memory_per_gpu()
        self.cpu_per_gpu = self.opt.cpu_per_gpu if self.opt.cpu_per_gpu is not None else cpg
        self.mem_per_gpu = self.opt.memory_mib_per_gpu if self.opt.memory_mib_per_gpu is not None else mpg

        traces = sorted(jobs, key=lambda j: (j.submit_time_s, j.id))
        # queues from the file first (an account maps to the first queue naming it), generated ones for the rest
        self.queues: dict[str, QueueConfig] = {}
        self.queue_of: dict[str, str] = {}
        for q in self.opt.queues or ():
            self.queues[q.name] = q
            self.queue_of.setdefault(_account(q.account), q.name)
        rest = [j for j in traces if _account(j.account) not in self.queue_of]
        for name, q in default_queues(rest, self.total_gpus, self.opt.share).items():
            if name in self.queues:  # a file queue of that name serves another account: keep the file's
                name = f"{name}-auto"
                q = q.model_copy(update={"name": name})
            self.queues[name] = q
            self.queue_of[q.account] = name

        self.history = RuntimeHistory() if self.opt.runtime_history else None
        self.node_by_name = {n.name: n for n in self.nodes}
        self.node_model = {n.name: (n.gpus[0].model if n.gpus else "") for n in self.nodes}
        self.model_gpus: dict[str, int] = {}  # GPUs of the largest node of each model
        for n in self.nodes:
            if n.gpus:
                m = n.gpus[0].model
                self.model_gpus[m] = max(self.model_gpus.get(m, 0), len(n.gpus))
        self.dropped: list[TraceJob] = []
        self.arrivals: list[TraceJob] = []
        fit_cache: dict[tuple, bool] = {}
        self._res_cache: dict[tuple, Resources] = {}
        for j in traces:
            j = j.split(gpn) if gpn else j
            cpu, mem = self._cpu_mem(j)
            key = (j.replicas, j.gpus_per_replica, cpu, mem, j.gpu_model)
            ok = fit_cache.get(key)
            if ok is None:
                ok = fit_cache[key] = cluster.can_ever_fit(*key)
            (self.arrivals if ok else self.dropped).append(j)

    def _cpu_mem(self, j: TraceJob) -> tuple[float, int]:
        g = j.gpus_per_replica
        cpu = j.cpu if j.cpu is not None else (self.cpu_per_gpu * g if g else 1.0)
        mem = j.memory_mib if j.memory_mib is not None else (self.mem_per_gpu * g if g else 1024)
        return float(cpu), int(mem)

    def _resources(self, j: TraceJob) -> Resources:
        cpu, mem = self._cpu_mem(j)
        key = (cpu, mem, j.gpus_per_replica, j.gpu_model)
        r = self._res_cache.get(key)
        if r is None:
            r = self._res_cache[key] = Resources(cpu=cpu, memory_mib=mem, gpu=j.gpus_per_replica, gpu_model=j.gpu_model)
        return r

    def _speed(self, j: TraceJob, allocations) -> float:
        """How fast a job runs on ``allocations``: its speed on their GPU type, and slower when spread over more
        nodes than that type's largest node needs (the trace's measured unconsolidated speed, else
        ``locality_slowdown``)."""
        if not allocations or (not j.speeds and not self.opt.locality_slowdown):
            return 1.0
        model = self.node_model.get(allocations[0].node, "")
        per_node = self.model_gpus.get(model, 0)
        spread = per_node > 0 and len({a.node for a in allocations}) > -(-j.num_gpus // per_node)
        speeds = j.speeds or {}
        if spread and f"{model}_unconsolidated" in speeds:
            return speeds[f"{model}_unconsolidated"]
        return speeds.get(model, 1.0) * ((1.0 - self.opt.locality_slowdown) if spread else 1.0)

    def _make(self, j: TraceJob) -> SimJob:
        acct = _account(j.account)
        queue = self.queue_of.get(acct)
        if queue is None:  # account unknown to a queue file: give it its own uncapped queue
            queue = self.queue_of[acct] = acct
            self.queues[acct] = QueueConfig(name=acct, account=acct)
        est = self.opt.runtime_estimate
        sj = SchedJob(
            id=j.id,
            user=j.user,
            account=acct,
            queue=queue,
            priority=j.priority,
            request=self._resources(j),
            replicas=j.replicas,
            submitted_at=j.submit_time_s,
            queued_since=j.submit_time_s,
            max_runtime_s=None if est is None else j.duration_s * est,
            speeds=j.speeds,
        )
        job = SimJob(j, sj)
        if self.history is not None:
            job.estimate = sj.expected_runtime_s = self.history.estimate(j.user)
        return job

    # ------------------------------------------------------------------------------------------------- run
    def run(self) -> SimResult:
        wall0 = time.perf_counter()
        gc_was_enabled = gc.isenabled()
        gc.disable()  # see _GC_OBJECTS
        try:
            return self._run(wall0)
        finally:
            if gc_was_enabled:
                gc.enable()

    def _run(self, wall0: float) -> SimResult:
        opt = self.opt
        factor = _decay_factor_function()
        half_life = opt.half_life_s
        tick = opt.tick_s if opt.tick_s and opt.tick_s > 0 else None
        quantum = opt.cycle_quantum_s if opt.cycle_quantum_s and opt.cycle_quantum_s > 0 else None
        strict = opt.strict
        policy = self.policy

        capacity = ClusterIndex(self.nodes)  # free capacity, indexed, kept up to date for the policies
        free = FreeCapacity(self.nodes)  # the same, as the decision checks read it

        jobs: dict[str, SimJob] = {}
        queued: dict[str, SchedJob] = {}
        running: dict[str, SimJob] = {}
        running_sj: dict[str, SchedJob] = {}
        # per running job: (SchedJob, attained at t=0 extrapolated, GPUs): attained(t) = c + t * g, one multiply-add
        # per running job per cycle
        attained_of: dict[str, tuple[SchedJob, float, int]] = {}
        heap: list[tuple[float, int, int, str, int]] = []
        seq = 0
        user_usage: dict[str, float] = {}
        queue_usage: dict[str, float] = {}
        user_gpus: dict[str, int] = {}
        queue_gpus: dict[str, int] = {}
        allocated = 0
        alloc_t: list[float] = [0.0]
        alloc_g: list[int] = [0]
        queue_t: list[float] = [0.0]
        queue_n: list[int] = [0]
        by_reason: dict[str, int] = {}
        preempt_t: list[float] = []
        invalid: dict[str, int] = {}
        arrivals = self.arrivals
        n_arr = len(arrivals)
        ai = 0
        last_charge = arrivals[0].submit_time_s if arrivals else 0.0
        next_tick = math.inf
        inf = math.inf
        cycles = tick_cycles = collections = 0
        last_cycle_t = -inf
        same_instant = capped = 0
        policy_s = 0.0
        idle_cycles = 0
        stopped = "done"
        now = last_charge
        restart = opt.restart_overhead_s
        grace = opt.preempt_grace_s
        est = opt.runtime_estimate
        progress = self.progress
        last_arrival = arrivals[-1].submit_time_s if arrivals else 0.0
        finished = 0
        next_report = wall0 + PROGRESS_EVERY_S

        def report() -> None:
            progress(
                SimProgress(
                    now, last_arrival, finished, n_arr, len(queued), len(running), cycles, time.perf_counter() - wall0
                )
            )

        def bad(problem: Problem) -> None:
            if strict:
                raise SimulationError(f"{self.policy_name} at t={now:.0f}: {problem.message}")
            if problem.kind not in invalid:
                log.warning("%s at t=%.0f: %s (further ones are only counted)", self.policy_name, now, problem.message)
            invalid[problem.kind] = invalid.get(problem.kind, 0) + 1

        def release(job: SimJob) -> None:
            nonlocal allocated
            sj = job.sj
            free.give(sj.allocations)
            capacity.release(sj.allocations)
            allocated -= job.gpus
            user_gpus[sj.user] -= job.gpus
            queue_gpus[sj.queue] -= job.gpus
            del running[sj.id]
            del running_sj[sj.id]
            del attained_of[sj.id]

        def stop_and_requeue(job: SimJob, t: float) -> None:
            """Release the victim and re-queue it with its remaining work (checkpointed at the request)."""
            sj = job.sj
            upto = job.preempt_at if job.preempt_at is not None else t
            job.remaining_s = max(0.0, job.remaining_s - (upto - job.run_start) * job.speed) + restart
            job.base_attained += (t - job.run_start) * job.gpus
            release(job)
            job.attempt += 1
            job.run_start = None
            job.preempt_at = None
            sj.attained_gpu_s = job.base_attained
            sj.started_at = None
            sj.allocations = ()
            sj.terminating = False
            if _HAS_PREEMPTED_BY:
                sj.preempted_by = None
            sj.queued_since = t
            if est is not None:
                sj.max_runtime_s = job.remaining_s * est
            if job.estimate is not None:  # what is left of it, at least the restart
                sj.expected_runtime_s = max(job.estimate - (job.trace.duration_s - job.remaining_s), restart, 60.0)
            queued[sj.id] = sj

        failures = NodeFailures(
            self.node_model, opt.node_failures, opt.node_mtbf_s, opt.node_repair_s, opt.failure_seed
        )
        down: dict[str, Allocation] = {}  # failed node -> the whole node, held so nothing starts there
        repair_of: dict[int, float] = {}  # heap sequence number of a failure -> its repair time
        n_failures = n_kills = 0

        def schedule_failure(f: tuple[float, str, float] | None) -> None:
            nonlocal seq
            if f is not None:
                seq += 1
                repair_of[seq] = f[2]
                heapq.heappush(heap, (f[0], seq, _NODE_DOWN, f[1], seq))

        def node_down(name: str, t: float, key: int) -> None:
            """Kill the jobs on the node (re-queued, losing the work since their last checkpoint) and hold the
            node until its repair."""
            nonlocal seq, n_failures, n_kills
            repair = repair_of.pop(key)
            if name in down:
                return  # already down: the repair already scheduled stands
            n_failures += 1
            for job in [j for j in running.values() if any(a.node == name for a in j.sj.allocations)]:
                if job.preempt_at is None:
                    job.preempt_at = t - (t - job.run_start) % opt.checkpoint_interval_s
                n_kills += 1
                stop_and_requeue(job, t)
            node = self.node_by_name[name]
            whole = Allocation(name, tuple(d.index for d in node.gpus), node.cpu, node.memory_mib)
            free.take((whole,))
            capacity.occupy((whole,))
            down[name] = whole
            seq += 1
            heapq.heappush(heap, (t + repair, seq, _NODE_UP, name, 0))

        def node_up(name: str, t: float) -> None:
            whole = down.pop(name)
            free.give((whole,))
            capacity.release((whole,))
            schedule_failure(failures.after_repair(name, t))

        def start(st: Start, t: float) -> bool:
            nonlocal allocated, seq
            problem = free.start_problem(st, queued)
            if problem is not None:
                bad(problem)
                return False
            allocs = st.allocations
            job = jobs[st.job_id]
            sj = job.sj
            free.take(allocs)
            capacity.occupy(allocs)
            del queued[sj.id]
            allocated += job.gpus
            user_gpus[sj.user] = user_gpus.get(sj.user, 0) + job.gpus
            queue_gpus[sj.queue] = queue_gpus.get(sj.queue, 0) + job.gpus
            running[sj.id] = job
            running_sj[sj.id] = sj
            attained_of[sj.id] = (sj, job.base_attained - t * job.gpus, job.gpus)
            job.run_start = t
            job.speed = self._speed(job.trace, allocs)
            if job.first_start is None:
                job.first_start = t
            sj.started_at = t
            sj.allocations = tuple(allocs)
            seq += 1
            heapq.heappush(heap, (t + job.remaining_s / job.speed, seq, _COMPLETE, sj.id, job.attempt))
            return True

        max_time = opt.max_time_s if opt.max_time_s is not None else inf
        for f in failures.first(now):
            schedule_failure(f)
        while True:
            if failures.any and not queued and not running and ai >= n_arr:
                break  # only failures are left to happen
            t_arr = arrivals[ai].submit_time_s if ai < n_arr else inf
            t_evt = heap[0][0] if heap else inf
            t = min(t_arr, t_evt, next_tick)
            if t == inf:
                break
            if quantum is not None and t != next_tick:
                t = math.ceil(t / quantum - 1e-12) * quantum
            if t > max_time:
                stopped = "max_time"
                now = max(now, max_time)
                break

            # charge usage for [last_charge, t] with the allocation that held over it
            elapsed = t - last_charge
            if elapsed > 0:
                user_usage = advance_usage(user_usage, user_gpus, elapsed, half_life, factor)
                queue_usage = advance_usage(queue_usage, queue_gpus, elapsed, half_life, factor)
                last_charge = t
            now = t

            changed = False
            while heap and heap[0][0] <= t:
                _, _, kind, jid, attempt = heapq.heappop(heap)
                if kind >= _NODE_DOWN:
                    if kind == _NODE_DOWN:
                        node_down(jid, t, attempt)
                    else:
                        node_up(jid, t)
                    changed = True
                    continue
                job = jobs[jid]
                if job.attempt != attempt or jid not in running:
                    continue
                if kind == _COMPLETE:
                    job.base_attained += (t - job.run_start) * job.gpus
                    job.sj.attained_gpu_s = job.base_attained
                    job.remaining_s = 0.0
                    job.finish = t
                    finished += 1
                    if self.history is not None:
                        self.history.add(job.sj.user, job.trace.duration_s)
                    release(job)
                    job.attempt += 1
                else:  # grace over: the victim is gone
                    stop_and_requeue(job, t)
                changed = True
            while ai < n_arr and arrivals[ai].submit_time_s <= t:
                job = self._make(arrivals[ai])
                ai += 1
                jobs[job.sj.id] = job
                queued[job.sj.id] = job.sj
                changed = True

            if changed and t == last_cycle_t and t != next_tick:
                # Zero-grace releases call a cycle at the same instant; a policy that keeps preempting and
                # restarting the same jobs would loop there forever. After a few, wait for the next tick instead
                # (as the live loop would), and count it.
                same_instant += 1
                if same_instant > _MAX_SAME_INSTANT:
                    capped += 1
                    if next_tick <= t:
                        next_tick = t + (tick or 1.0)
                    changed = False
            elif changed or t == next_tick:
                same_instant = 0
            if changed or t == next_tick:
                last_cycle_t = t
                if not changed:
                    tick_cycles += 1
                # ---- one scheduling cycle
                for sj, c, g in attained_of.values():
                    sj.attained_gpu_s = c + t * g
                snap = Snapshot(
                    now=t,
                    nodes=self.nodes,
                    queued=list(queued.values()),
                    running=list(running_sj.values()),
                    queues=self.queues,
                    user_usage=dict(user_usage),
                    queue_usage=dict(queue_usage),
                    capacity=capacity,
                    explain=False,
                )
                p0 = time.perf_counter()
                decisions: Decisions = policy(snap)
                policy_s += time.perf_counter() - p0
                cycles += 1
                if progress is not None and cycles % 64 == 0 and time.perf_counter() >= next_report:
                    report()
                    next_report = time.perf_counter() + PROGRESS_EVERY_S
                if gc.get_count()[0] > _GC_OBJECTS or cycles % _GC_CYCLES == 0:
                    collections += 1
                    gc.collect(2 if collections % 50 == 0 else 1)
                acted = False
                # Victims stop at the end of their grace; until then they hold their GPUs, so starts are judged as
                # the live loop judges them. With no grace, a release event now: the cycle that follows at once
                # can start their preemptors on the freed GPUs, as the live loop does when it sees them stop.
                seen: set[str] = set()
                for pre in decisions.preemptions:
                    problem = preemption_problem(pre, running_sj, seen)
                    if problem is not None:
                        bad(problem)
                        continue
                    seen.add(pre.job_id)
                    job = running[pre.job_id]
                    job.preemptions += 1
                    job.sj.preemptions = job.preemptions
                    by_reason[pre.reason] = by_reason.get(pre.reason, 0) + 1
                    preempt_t.append(t)
                    acted = True
                    job.sj.terminating = True
                    if _HAS_PREEMPTED_BY:
                        job.sj.preempted_by = pre.by_job_id
                    job.preempt_at = t
                    seq += 1
                    heapq.heappush(heap, (t + grace, seq, _RELEASE, job.sj.id, job.attempt))
                for st in decisions.starts:
                    if start(st, t):
                        acted = True

                wake = decisions.wake_at if opt.wake_hints else None
                del decisions, snap

                if alloc_g[-1] != allocated:
                    if alloc_t[-1] == t:
                        alloc_g[-1] = allocated
                    else:
                        alloc_t.append(t)
                        alloc_g.append(allocated)
                if queue_n[-1] != len(queued):
                    if queue_t[-1] == t:
                        queue_n[-1] = len(queued)
                    else:
                        queue_t.append(t)
                        queue_n.append(len(queued))

                if not queued or tick is None or wake == inf:
                    next_tick = inf
                elif wake is None or wake <= t + tick:
                    next_tick = t + tick
                else:  # the first periodic cycle at or after the policy's wake-up time
                    next_tick = t + tick * math.ceil((wake - t) / tick - 1e-6)
                if queued and not heap and ai >= n_arr and not acted:
                    idle_cycles += 1
                    if idle_cycles >= max(1, opt.stuck_ticks) or next_tick == inf:
                        stopped = "stuck"
                        break
                else:
                    idle_cycles = 0

        end = now
        if progress is not None:
            report()
        for job in running.values():  # only on max_time: account what they got so far
            job.sj.attained_gpu_s = job.base_attained + (end - job.run_start) * job.gpus
        return SimResult(
            policy=self.policy_name,
            cluster=self.cluster,
            jobs=list(jobs.values()),
            dropped=self.dropped,
            not_arrived=n_arr - ai,
            end_time=end,
            alloc_t=alloc_t,
            alloc_gpus=alloc_g,
            queue_t=queue_t,
            queue_len=queue_n,
            total_gpus=self.total_gpus,
            cycles=cycles,
            tick_cycles=tick_cycles,
            policy_s=policy_s,
            wall_s=time.perf_counter() - wall0,
            preemptions_by_reason=by_reason,
            invalid_decisions=invalid,
            stopped=stopped,
            same_instant_capped=capped,
            preempt_t=preempt_t,
            node_failures=n_failures,
            failure_kills=n_kills,
        )


def simulate(
    jobs: Iterable[TraceJob], cluster: ClusterSpec, policy: Policy, options: SimOptions | None = None
) -> SimResult:
    return Simulator(jobs, cluster, policy, options).run()
