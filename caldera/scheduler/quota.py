"""Queue quotas: checking a set of queue configs against the cluster, and jobs that can never be placed.

Per queue and resource key (``cpu``, ``memory`` in MiB, ``gpu``, ``gpu/<model>``):

* **guarantee**: always available to the queue; when it is below its guarantee it reclaims (preempts) from queues
  above their deserved share;
* **deserved**: its weighted fair share (defaults to the guarantee); usage above it is borrowed and reclaimable;
* **capability**: a hard ceiling it never goes over, even on an idle cluster.

A queue missing from ``Snapshot.queues`` is unlimited with weight 1 (no guarantee, nothing deserved).
"""

from __future__ import annotations

from collections.abc import Iterable

from caldera.core.cluster import Node
from caldera.core.resources import CPU, GPU, MEMORY, Resources, gpu_key
from caldera.core.tenancy import QueueConfig, Quota


def deserved(q: Quota) -> float:
    return q.deserved if q.deserved is not None else q.guarantee


def cluster_capacity(nodes: Iterable[Node]) -> dict[str, float]:
    """Total of each resource key over ``nodes`` (all of them, schedulable or not: a cordoned node comes back)."""
    cap: dict[str, float] = {CPU: 0.0, MEMORY: 0.0, GPU: 0.0}
    for n in nodes:
        cap[CPU] += n.cpu
        cap[MEMORY] += n.memory_mib
        cap[GPU] += len(n.gpus)
        for d in n.gpus:
            k = gpu_key(d.model)
            cap[k] = cap.get(k, 0.0) + 1
    return cap


def _n(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def validate_queues(queues: list[QueueConfig], nodes: list[Node]) -> list[str]:
    """Human-readable reasons this set of queues cannot hold on ``nodes``; empty when it can.

    Checks: duplicate names; per queue and key, capability below guarantee, deserved below guarantee, deserved
    above capability; a ``gpu/<model>`` key for a model no node has; per key, guarantees adding up to more than the
    cluster has.
    """
    errors: list[str] = []
    nodes = list(nodes)
    cap = cluster_capacity(nodes)
    models = sorted(k.split("/", 1)[1] for k in cap if k.startswith(GPU + "/"))
    seen: set[str] = set()
    sums: dict[str, list[tuple[str, float]]] = {}
    for q in queues:
        if q.name in seen:
            errors.append(f"queue {q.name}: defined twice")
            continue
        seen.add(q.name)
        for key, quota in sorted(q.quotas.items()):
            if key.startswith(GPU + "/") and key not in cap:
                present = ", ".join(models) if models else "none"
                errors.append(
                    f"queue {q.name}: no node has GPU model {key.split('/', 1)[1]} ({key}); models present: {present}"
                )
            g = quota.guarantee
            d = deserved(quota)
            c = quota.capability
            if c is not None and c < g:
                errors.append(f"queue {q.name}: capability for {key} ({_n(c)}) is below its guarantee ({_n(g)})")
            if quota.deserved is not None and quota.deserved < g:
                errors.append(
                    f"queue {q.name}: deserved share for {key} ({_n(quota.deserved)}) is below its guarantee ({_n(g)})"
                )
            if c is not None and d > c:
                errors.append(f"queue {q.name}: deserved share for {key} ({_n(d)}) is above its capability ({_n(c)})")
            if g > 0:
                sums.setdefault(key, []).append((q.name, g))
    for key, parts in sorted(sums.items()):
        total = sum(g for _, g in parts)
        have = cap.get(key, 0.0)
        if total > have + 1e-9:
            who = ", ".join(f"{name}={_n(g)}" for name, g in parts)
            unit = " MiB" if key == MEMORY else ""
            errors.append(
                f"guarantees for {key} add up to {_n(total)}{unit} but the cluster has {_n(have)}{unit} (queues: {who})"
            )
    return errors


def never_fits(request: Resources, replicas: int, nodes: list[Node]) -> str | None:
    """Why a job of ``replicas`` x ``request`` can never be placed on ``nodes`` (even empty), or None.

    Each replica must fit on one node, with GPUs of one model; a gang uses one model for all replicas.
    """
    nodes = list(nodes)
    g = request.gpu
    model = request.gpu_model
    if replicas < 1:
        return "a job needs at least one replica"
    if not nodes:
        return "the cluster has no nodes"
    by_model: dict[str, list[tuple[Node, int]]] = {}
    for n in nodes:
        counts: dict[str, int] = {}
        for d in n.gpus:
            counts[d.model] = counts.get(d.model, 0) + 1
        for m, c in counts.items():
            by_model.setdefault(m, []).append((n, c))
    if g > 0:
        if model is not None and model not in by_model:
            have = ", ".join(sorted(by_model)) or "none"
            return f"no node has GPU model {model} (models present: {have})"
        if not by_model:
            return "the cluster has no GPUs"
        pools = {model: by_model[model]} if model else by_model
        largest = max(c for p in pools.values() for _, c in p)
        what = f"{model} GPUs" if model else "GPUs of one model"
        if g > largest:
            return f"needs {g} {what} per replica but the largest node has {largest}"
        total = max(sum(c for _, c in p) for p in pools.values())
        if g * replicas > total:
            return f"needs {g * replicas} {what} in all but the cluster has {total}"
    else:
        pools = {None: [(n, 0) for n in nodes]}  # type: ignore[dict-item]
    # one node must hold a replica's GPUs, CPU and memory together; and the gang must fit the empty cluster
    best_fit = 0
    any_node = False
    for p in pools.values():
        fit = 0
        for n, c in p:
            k = replicas
            if g > 0:
                k = min(k, c // g)
            if request.cpu > 0:
                k = min(k, int((n.cpu + 1e-9) // request.cpu))
            if request.memory_mib > 0:
                k = min(k, n.memory_mib // request.memory_mib)
            if k > 0:
                any_node = True
            fit += max(k, 0)
        best_fit = max(best_fit, fit)
    if not any_node:
        gp = f"{g} GPUs, " if g else ""
        return f"no node has {gp}{_n(request.cpu)} CPUs and {request.memory_mib} MiB of memory together for one replica"
    if best_fit < replicas:
        return f"needs {replicas} replicas but at most {best_fit} fit on the whole cluster at once"
    return None
