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
from caldera.scheduler.queue_memo import QueueMemo
from caldera.scheduler.snapshot import Decisions, Policy, Preempt, SchedJob, Snapshot, Start
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
            return Replay(self, wall0).run()
        finally:
            if gc_was_enabled:
                gc.enable()


class Replay:
    """One replay of a :class:`Simulator`'s jobs: the state kept between events, one method per kind of event
    (an arrival, a completion, the end of a victim's grace, a node failing, a node repaired), and the scheduling
    cycle that follows an instant's events (a preemption and a start are a method each).

    Each instant: charge decayed usage for the time since the last one, apply every event due by then, and run a
    cycle when they changed anything or a periodic cycle is due; the replay ends when nothing is left to happen,
    at ``max_time_s``, or when the queue is stuck."""

    def __init__(self, sim: Simulator, wall0: float) -> None:
        opt = self.opt = sim.opt
        self.sim = sim
        self.wall0 = wall0
        self.factor = _decay_factor_function()
        self.tick = opt.tick_s if opt.tick_s and opt.tick_s > 0 else None
        self.quantum = opt.cycle_quantum_s if opt.cycle_quantum_s and opt.cycle_quantum_s > 0 else None
        self.max_time = opt.max_time_s if opt.max_time_s is not None else math.inf

        self.capacity = ClusterIndex(sim.nodes)  # free capacity, indexed, kept up to date for the policies
        # the queued jobs' features from cycle to cycle: a queued job's SchedJob is the same object, unchanged
        # while it stays queued (it changes only while it runs)
        self.queue_memo = QueueMemo()
        self.free = FreeCapacity(sim.nodes)  # the same, as the decision checks read it
        self.jobs: dict[str, SimJob] = {}
        self.queued: dict[str, SchedJob] = {}
        self.running: dict[str, SimJob] = {}
        self.running_sj: dict[str, SchedJob] = {}
        # per running job: (SchedJob, attained at t=0 extrapolated, GPUs): attained(t) = c + t * g, one multiply-add
        # per running job per cycle
        self.attained_of: dict[str, tuple[SchedJob, float, int]] = {}
        self.heap: list[tuple[float, int, int, str, int]] = []  # (time, sequence, kind, job or node, attempt or key)
        self.seq = 0
        self.user_usage: dict[str, float] = {}
        self.queue_usage: dict[str, float] = {}
        self.user_gpus: dict[str, int] = {}
        self.queue_gpus: dict[str, int] = {}
        self.allocated = 0
        self.alloc_t: list[float] = [0.0]
        self.alloc_g: list[int] = [0]
        self.queue_t: list[float] = [0.0]
        self.queue_n: list[int] = [0]
        self.by_reason: dict[str, int] = {}
        self.preempt_t: list[float] = []
        self.invalid: dict[str, int] = {}

        self.arrivals = sim.arrivals
        self.n_arr = len(self.arrivals)
        self.ai = 0  # the next arrival
        self.last_charge = self.arrivals[0].submit_time_s if self.arrivals else 0.0
        self.now = self.last_charge
        self.last_arrival = self.arrivals[-1].submit_time_s if self.arrivals else 0.0
        self.next_tick = math.inf
        self.last_cycle_t = -math.inf
        self.cycles = self.tick_cycles = self.collections = 0
        self.same_instant = self.capped = self.idle_cycles = 0
        self.policy_s = 0.0
        self.stopped = "done"
        self.finished = 0
        self.next_report = wall0 + PROGRESS_EVERY_S

        self.failures = NodeFailures(
            sim.node_model, opt.node_failures, opt.node_mtbf_s, opt.node_repair_s, opt.failure_seed
        )
        self.down: dict[str, Allocation] = {}  # failed node -> the whole node, held so nothing starts there
        self.repair_of: dict[int, float] = {}  # heap sequence number of a failure -> its repair time
        self.n_failures = self.n_kills = 0
        # what each kind of heap event does; each says whether it changed anything
        self.on_event = {
            _COMPLETE: self.completion,
            _RELEASE: self.grace_over,
            _NODE_DOWN: self.node_down,
            _NODE_UP: self.node_up,
        }

    # ------------------------------------------------------------------------------------------------ the loop
    def run(self) -> SimResult:
        for f in self.failures.first(self.now):
            self.schedule_failure(f)
        while self.instant():
            pass
        return self.result()

    def instant(self) -> bool:
        """The next instant: its events, then a cycle if they changed anything or a periodic one is due. False once
        the replay is over."""
        if self.failures.any and not self.queued and not self.running and self.ai >= self.n_arr:
            return False  # only failures are left to happen
        t = min(
            self.arrivals[self.ai].submit_time_s if self.ai < self.n_arr else math.inf,
            self.heap[0][0] if self.heap else math.inf,
            self.next_tick,
        )
        if t == math.inf:
            return False
        if self.quantum is not None and t != self.next_tick:
            t = math.ceil(t / self.quantum - 1e-12) * self.quantum
        if t > self.max_time:
            self.stopped = "max_time"
            self.now = max(self.now, self.max_time)
            return False
        self.charge_usage(t)
        changed = False
        while self.heap and self.heap[0][0] <= t:
            _, _, kind, key, n = heapq.heappop(self.heap)
            changed = self.on_event[kind](key, t, n) or changed
        while self.ai < self.n_arr and self.arrivals[self.ai].submit_time_s <= t:
            self.arrival(self.arrivals[self.ai])
            changed = True
        changed = self.within_same_instant_cap(t, changed)
        if not (changed or t == self.next_tick):
            return True
        self.last_cycle_t = t
        if not changed:
            self.tick_cycles += 1
        return self.cycle(t)

    def charge_usage(self, t: float) -> None:
        """Charge decayed usage for [last charge, t] with the allocation that held over it."""
        elapsed = t - self.last_charge
        if elapsed > 0:
            half_life = self.opt.half_life_s
            self.user_usage = advance_usage(self.user_usage, self.user_gpus, elapsed, half_life, self.factor)
            self.queue_usage = advance_usage(self.queue_usage, self.queue_gpus, elapsed, half_life, self.factor)
            self.last_charge = t
        self.now = t

    def within_same_instant_cap(self, t: float, changed: bool) -> bool:
        """Zero-grace releases call a cycle at the same instant; a policy that keeps preempting and restarting the
        same jobs would loop there forever. After a few, wait for the next tick instead (as the live loop would),
        and count it. Whether the instant's events still call a cycle."""
        if changed and t == self.last_cycle_t and t != self.next_tick:
            self.same_instant += 1
            if self.same_instant > _MAX_SAME_INSTANT:
                self.capped += 1
                if self.next_tick <= t:
                    self.next_tick = t + (self.tick or 1.0)
                return False
        elif changed or t == self.next_tick:
            self.same_instant = 0
        return changed

    # ---------------------------------------------------------------------------------------------- the events
    def arrival(self, trace: TraceJob) -> None:
        job = self.sim._make(trace)
        self.ai += 1
        self.jobs[job.sj.id] = job
        self.queued[job.sj.id] = job.sj

    def completion(self, jid: str, t: float, attempt: int) -> bool:
        job = self.jobs[jid]
        if job.attempt != attempt or jid not in self.running:
            return False  # an earlier attempt's
        job.base_attained += (t - job.run_start) * job.gpus
        job.sj.attained_gpu_s = job.base_attained
        job.remaining_s = 0.0
        job.finish = t
        self.finished += 1
        if self.sim.history is not None:
            self.sim.history.add(job.sj.user, job.trace.duration_s)
        self.release(job)
        job.attempt += 1
        return True

    def grace_over(self, jid: str, t: float, attempt: int) -> bool:
        """A victim's grace is over: it is gone."""
        job = self.jobs[jid]
        if job.attempt != attempt or jid not in self.running:
            return False
        self.stop_and_requeue(job, t)
        return True

    def node_down(self, name: str, t: float, key: int) -> bool:
        """Kill the jobs on the node (re-queued, losing the work since their last checkpoint) and hold the node
        until its repair."""
        repair = self.repair_of.pop(key)
        if name in self.down:
            return True  # already down: the repair already scheduled stands
        self.n_failures += 1
        for job in [j for j in self.running.values() if any(a.node == name for a in j.sj.allocations)]:
            if job.preempt_at is None:
                job.preempt_at = t - (t - job.run_start) % self.opt.checkpoint_interval_s
            self.n_kills += 1
            self.stop_and_requeue(job, t)
        node = self.sim.node_by_name[name]
        whole = Allocation(name, tuple(d.index for d in node.gpus), node.cpu, node.memory_mib)
        self.free.take((whole,))
        self.capacity.occupy((whole,))
        self.down[name] = whole
        self.push(t + repair, _NODE_UP, name, 0)
        return True

    def node_up(self, name: str, t: float, _key: int) -> bool:
        whole = self.down.pop(name)
        self.free.give((whole,))
        self.capacity.release((whole,))
        self.schedule_failure(self.failures.after_repair(name, t))
        return True

    # ------------------------------------------------------------------------------------------------ a cycle
    def cycle(self, t: float) -> bool:
        """Call the policy on a snapshot and apply its decisions. False when the replay is stuck."""
        for sj, c, g in self.attained_of.values():
            sj.attained_gpu_s = c + t * g
        snap = Snapshot(
            now=t,
            nodes=self.sim.nodes,
            queued=list(self.queued.values()),
            running=list(self.running_sj.values()),
            queues=self.sim.queues,
            user_usage=dict(self.user_usage),
            queue_usage=dict(self.queue_usage),
            capacity=self.capacity,
            explain=False,
            queue_memo=self.queue_memo,
        )
        p0 = time.perf_counter()
        decisions: Decisions = self.sim.policy(snap)
        self.policy_s += time.perf_counter() - p0
        self.cycles += 1
        if self.sim.progress is not None and self.cycles % 64 == 0 and time.perf_counter() >= self.next_report:
            self.report()
            self.next_report = time.perf_counter() + PROGRESS_EVERY_S
        if gc.get_count()[0] > _GC_OBJECTS or self.cycles % _GC_CYCLES == 0:
            self.collections += 1
            gc.collect(2 if self.collections % 50 == 0 else 1)
        acted = False
        # Victims stop at the end of their grace; until then they hold their GPUs, so starts are judged as the
        # live loop judges them. With no grace, a release event now: the cycle that follows at once can start
        # their preemptors on the freed GPUs, as the live loop does when it sees them stop.
        seen: set[str] = set()
        for pre in decisions.preemptions:
            acted = self.preempt(pre, t, seen) or acted
        for st in decisions.starts:
            acted = self.start(st, t) or acted
        wake = decisions.wake_at if self.opt.wake_hints else None
        del decisions, snap
        self.record_series(t)
        self.next_tick = self.next_tick_after(t, wake)
        if self.queued and not self.heap and self.ai >= self.n_arr and not acted:
            self.idle_cycles += 1
            if self.idle_cycles >= max(1, self.opt.stuck_ticks) or self.next_tick == math.inf:
                self.stopped = "stuck"
                return False
        else:
            self.idle_cycles = 0
        return True

    def preempt(self, pre: Preempt, t: float, seen: set[str]) -> bool:
        problem = preemption_problem(pre, self.running_sj, seen)
        if problem is not None:
            self.bad(problem)
            return False
        seen.add(pre.job_id)
        job = self.running[pre.job_id]
        job.preemptions += 1
        job.sj.preemptions = job.preemptions
        self.by_reason[pre.reason] = self.by_reason.get(pre.reason, 0) + 1
        self.preempt_t.append(t)
        job.sj.terminating = True
        if _HAS_PREEMPTED_BY:
            job.sj.preempted_by = pre.by_job_id
        job.preempt_at = t
        self.push(t + self.opt.preempt_grace_s, _RELEASE, job.sj.id, job.attempt)
        return True

    def start(self, st: Start, t: float) -> bool:
        problem = self.free.start_problem(st, self.queued)
        if problem is not None:
            self.bad(problem)
            return False
        allocs = st.allocations
        job = self.jobs[st.job_id]
        sj = job.sj
        self.free.take(allocs)
        self.capacity.occupy(allocs)
        del self.queued[sj.id]
        self.allocated += job.gpus
        self.user_gpus[sj.user] = self.user_gpus.get(sj.user, 0) + job.gpus
        self.queue_gpus[sj.queue] = self.queue_gpus.get(sj.queue, 0) + job.gpus
        self.running[sj.id] = job
        self.running_sj[sj.id] = sj
        self.attained_of[sj.id] = (sj, job.base_attained - t * job.gpus, job.gpus)
        job.run_start = t
        job.speed = self.sim._speed(job.trace, allocs)
        if job.first_start is None:
            job.first_start = t
        sj.started_at = t
        sj.allocations = tuple(allocs)
        self.push(t + job.remaining_s / job.speed, _COMPLETE, sj.id, job.attempt)
        return True

    def record_series(self, t: float) -> None:
        """GPUs allocated and jobs queued over time, one point per change."""
        if self.alloc_g[-1] != self.allocated:
            if self.alloc_t[-1] == t:
                self.alloc_g[-1] = self.allocated
            else:
                self.alloc_t.append(t)
                self.alloc_g.append(self.allocated)
        if self.queue_n[-1] != len(self.queued):
            if self.queue_t[-1] == t:
                self.queue_n[-1] = len(self.queued)
            else:
                self.queue_t.append(t)
                self.queue_n.append(len(self.queued))

    def next_tick_after(self, t: float, wake: float | None) -> float:
        """The next periodic cycle: none with nothing queued or when the policy says only an event can help,
        else the first tick at or after the policy's wake-up time."""
        tick = self.tick
        if not self.queued or tick is None or wake == math.inf:
            return math.inf
        if wake is None or wake <= t + tick:
            return t + tick
        return t + tick * math.ceil((wake - t) / tick - 1e-6)

    # ------------------------------------------------------------------------------------------- bookkeeping
    def push(self, t: float, kind: int, key: str, n: int) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, key, n))

    def release(self, job: SimJob) -> None:
        sj = job.sj
        self.free.give(sj.allocations)
        self.capacity.release(sj.allocations)
        self.allocated -= job.gpus
        self.user_gpus[sj.user] -= job.gpus
        self.queue_gpus[sj.queue] -= job.gpus
        del self.running[sj.id]
        del self.running_sj[sj.id]
        del self.attained_of[sj.id]

    def stop_and_requeue(self, job: SimJob, t: float) -> None:
        """Release the victim and re-queue it with its remaining work (checkpointed at the request)."""
        sj = job.sj
        restart = self.opt.restart_overhead_s
        upto = job.preempt_at if job.preempt_at is not None else t
        job.remaining_s = max(0.0, job.remaining_s - (upto - job.run_start) * job.speed) + restart
        job.base_attained += (t - job.run_start) * job.gpus
        self.release(job)
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
        if self.opt.runtime_estimate is not None:
            sj.max_runtime_s = job.remaining_s * self.opt.runtime_estimate
        if job.estimate is not None:  # what is left of it, at least the restart
            sj.expected_runtime_s = max(job.estimate - (job.trace.duration_s - job.remaining_s), restart, 60.0)
        self.queued[sj.id] = sj

    def schedule_failure(self, f: tuple[float, str, float] | None) -> None:
        if f is not None:
            self.seq += 1
            self.repair_of[self.seq] = f[2]
            heapq.heappush(self.heap, (f[0], self.seq, _NODE_DOWN, f[1], self.seq))

    def bad(self, problem: Problem) -> None:
        if self.opt.strict:
            raise SimulationError(f"{self.sim.policy_name} at t={self.now:.0f}: {problem.message}")
        if problem.kind not in self.invalid:
            log.warning(
                "%s at t=%.0f: %s (further ones are only counted)", self.sim.policy_name, self.now, problem.message
            )
        self.invalid[problem.kind] = self.invalid.get(problem.kind, 0) + 1

    def report(self) -> None:
        assert self.sim.progress is not None
        self.sim.progress(
            SimProgress(
                self.now,
                self.last_arrival,
                self.finished,
                self.n_arr,
                len(self.queued),
                len(self.running),
                self.cycles,
                time.perf_counter() - self.wall0,
            )
        )

    def result(self) -> SimResult:
        end = self.now
        if self.sim.progress is not None:
            self.report()
        for job in self.running.values():  # only on max_time: account what they got so far
            job.sj.attained_gpu_s = job.base_attained + (end - job.run_start) * job.gpus
        return SimResult(
            policy=self.sim.policy_name,
            cluster=self.sim.cluster,
            jobs=list(self.jobs.values()),
            dropped=self.sim.dropped,
            not_arrived=self.n_arr - self.ai,
            end_time=end,
            alloc_t=self.alloc_t,
            alloc_gpus=self.alloc_g,
            queue_t=self.queue_t,
            queue_len=self.queue_n,
            total_gpus=self.sim.total_gpus,
            cycles=self.cycles,
            tick_cycles=self.tick_cycles,
            policy_s=self.policy_s,
            wall_s=time.perf_counter() - self.wall0,
            preemptions_by_reason=self.by_reason,
            invalid_decisions=self.invalid,
            stopped=self.stopped,
            same_instant_capped=self.capped,
            preempt_t=self.preempt_t,
            node_failures=self.n_failures,
            failure_kills=self.n_kills,
        )


def simulate(
    jobs: Iterable[TraceJob], cluster: ClusterSpec, policy: Policy, options: SimOptions | None = None
) -> SimResult:
    return Simulator(jobs, cluster, policy, options).run()
