"""Small builders for scheduler tests and experiments: nodes, jobs and snapshots in a line each, and a checker that
decisions are consistent with the snapshot they came from."""

from __future__ import annotations

from collections.abc import Iterable

from caldera.core.cluster import Allocation, Device, Node
from caldera.core.resources import Resources
from caldera.core.tenancy import PriorityClass, QueueConfig
from caldera.scheduler.snapshot import Decisions, SchedJob, Snapshot
from caldera.scheduler.validation import decision_errors

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
    """Raise AssertionError unless every decision in ``d`` can be applied to ``snap`` and every queued job that
    does not start says why (:func:`caldera.scheduler.validation.decision_errors`, the check production runs)."""
    errors = decision_errors(snap, d)
    assert not errors, "\n".join(f"{p.kind}: {p.message}" for p in errors[:20])
