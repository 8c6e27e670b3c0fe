"""Small builders for scheduler tests and experiments: nodes, jobs and snapshots in a line each, and a checker that
decisions are consistent with the snapshot they came from."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from caldera.core.cluster import Allocation, Device, Node
from caldera.core.resources import Resources
from caldera.core.tenancy import PriorityClass, QueueConfig
from caldera.scheduler.snapshot import Decisions, SchedJob, Snapshot

NOW = 1_000_000.0


def node(
    name: str,
    gpus: int = 8,
    model: str = "a100",
    cpu: float = 64.0,
    memory_mib: int = 512 * 1024,
    schedulable: bool = True,
) -> Node:
    return Node(name, cpu, memory_mib, tuple(Device(i, model, 81920) for i in range(gpus)), schedulable)


def nodes(count: int, gpus: int = 8, model: str = "a100", prefix: str = "n", **kw) -> list[Node]:
    return [node(f"{prefix}{i}", gpus, model, **kw) for i in range(count)]


def job(
    id: str,
    gpu: int = 1,
    *,
    replicas: int = 1,
    user: str = "alice",
    queue: str = "q",
    priority: PriorityClass | str = PriorityClass.NORMAL,
    model: str | None = None,
    cpu: float = 1.0,
    memory_mib: int = 1024,
    queued_since: float | None = None,
    max_runtime_s: float | None = None,
    interactive: bool = False,
    attained_gpu_s: float = 0.0,
    account: str = "acct",
) -> SchedJob:
    """A queued job (``queued_since`` defaults to 10 s before ``NOW``)."""
    qs = NOW - 10 if queued_since is None else queued_since
    return SchedJob(
        id=id,
        user=user,
        account=account,
        queue=queue,
        priority=PriorityClass(priority),
        request=Resources(gpu=gpu, gpu_model=model, cpu=cpu, memory_mib=memory_mib),
        replicas=replicas,
        submitted_at=qs,
        queued_since=qs,
        interactive=interactive,
        max_runtime_s=max_runtime_s,
        attained_gpu_s=attained_gpu_s,
    )


def running(
    id: str,
    placement: dict[str, Iterable[int]] | list[tuple[str, Iterable[int]]],
    *,
    user: str = "bob",
    queue: str = "q",
    priority: PriorityClass | str = PriorityClass.NORMAL,
    started_at: float | None = None,
    max_runtime_s: float | None = None,
    terminating: bool = False,
    preempted_by: str | None = None,
    cpu: float = 1.0,
    memory_mib: int = 1024,
    model: str | None = None,
    attained_gpu_s: float = 0.0,
    interactive: bool = False,
) -> SchedJob:
    """A running job placed on ``{node: [gpu indices]}`` (one replica per entry; all replicas the same size)."""
    items = list(placement.items()) if isinstance(placement, dict) else list(placement)
    allocs = tuple(Allocation(n, tuple(g), cpu, memory_mib) for n, g in items)
    per = len(allocs[0].gpus) if allocs else 0
    st = NOW - 100 if started_at is None else started_at
    return SchedJob(
        id=id,
        user=user,
        account="acct",
        queue=queue,
        priority=PriorityClass(priority),
        request=Resources(gpu=per, gpu_model=model, cpu=cpu, memory_mib=memory_mib),
        replicas=len(allocs),
        submitted_at=st - 10,
        queued_since=st - 10,
        interactive=interactive,
        max_runtime_s=max_runtime_s,
        attained_gpu_s=attained_gpu_s,
        started_at=st,
        allocations=allocs,
        terminating=terminating,
        preempted_by=preempted_by,
    )


def snapshot(
    node_list: list[Node],
    queued: list[SchedJob] = (),
    running_jobs: list[SchedJob] = (),
    queues: Iterable[QueueConfig] | dict[str, QueueConfig] = (),
    now: float = NOW,
    user_usage: dict[str, float] | None = None,
    queue_usage: dict[str, float] | None = None,
) -> Snapshot:
    qs = dict(queues) if isinstance(queues, dict) else {q.name: q for q in queues}
    return Snapshot(
        now=now,
        nodes=list(node_list),
        queued=list(queued),
        running=list(running_jobs),
        queues=qs,
        user_usage=dict(user_usage or {}),
        queue_usage=dict(queue_usage or {}),
    )


def check_decisions(snap: Snapshot, d: Decisions) -> None:
    """Raise AssertionError unless ``d`` is consistent with ``snap``: starts are queued jobs with one allocation per
    replica of the right size on free devices of the right model, within CPU and memory; preemptions name running
    jobs that are not already terminating; every queued job that does not start has a non-empty reason list."""
    by_node = {n.name: n for n in snap.nodes if n.schedulable}
    used_gpus: dict[str, set[int]] = defaultdict(set)
    cpu: dict[str, float] = defaultdict(float)
    mem: dict[str, int] = defaultdict(int)
    for j in snap.running:
        for a in j.allocations:
            used_gpus[a.node].update(a.gpus)
            cpu[a.node] += a.cpu
            mem[a.node] += a.memory_mib
    queued = {j.id: j for j in snap.queued}
    started = set()
    for st in d.starts:
        assert st.job_id in queued, f"start of {st.job_id}, which is not queued"
        assert st.job_id not in started, f"{st.job_id} started twice"
        started.add(st.job_id)
        j = queued[st.job_id]
        assert len(st.allocations) == j.replicas, f"{j.id}: {len(st.allocations)} allocations for {j.replicas}"
        models = set()
        for a in st.allocations:
            assert a.node in by_node, f"{j.id} on unknown or unschedulable node {a.node}"
            n = by_node[a.node]
            assert len(a.gpus) == j.request.gpu == len(set(a.gpus)), f"{j.id}: wrong GPUs {a.gpus}"
            devmodel = {dv.index: dv.model for dv in n.gpus}
            for g in a.gpus:
                assert g in devmodel, f"{j.id}: {a.node} has no GPU {g}"
                assert g not in used_gpus[a.node], f"{j.id}: {a.node} GPU {g} is not free"
                used_gpus[a.node].add(g)
                models.add(devmodel[g])
            if j.request.gpu_model:
                assert models <= {j.request.gpu_model}, f"{j.id}: wrong model {models}"
            cpu[a.node] += a.cpu
            mem[a.node] += a.memory_mib
            assert cpu[a.node] <= n.cpu + 1e-6, f"{a.node} CPU over-committed"
            assert mem[a.node] <= n.memory_mib, f"{a.node} memory over-committed"
        assert len(models) <= 1, f"{j.id} spans GPU models {models}"
    runs = {j.id: j for j in snap.running}
    seen = set()
    for p in d.preemptions:
        assert p.job_id in runs and not runs[p.job_id].terminating, f"preemption of {p.job_id}"
        assert p.job_id not in seen, f"{p.job_id} preempted twice"
        seen.add(p.job_id)
        assert p.message and p.reason
    for jid in queued:
        if jid in started:
            assert jid not in d.pending, f"{jid} started and pending"
        else:
            assert d.pending.get(jid), f"{jid} has no pending reason"
            for r in d.pending[jid]:
                assert r.code and r.message, f"{jid}: empty reason {r!r}"
