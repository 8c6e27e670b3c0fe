"""Caldera's queues and accounts as Kueue objects, and a Workload's conditions as Caldera's pending reasons.

Translation (Kueue ``v1beta2``):

* every GPU model becomes a ResourceFlavor ``gpu-<model>`` whose node label (``nvidia.com/gpu.product``) pins the
  pods to nodes of that model; CPU and memory share one flavor without node labels (``caldera-default``);
* every Caldera queue becomes a ClusterQueue ``caldera-<queue>``: a quota's guarantee is the ``nominalQuota``, its
  capability minus the guarantee the ``borrowingLimit`` (no capability: no limit), the deserved GPU share (else the
  queue's weight) the ``fairSharing.weight``; all queues of an account, or of the whole cluster, form one cohort;
* a resource without a Caldera quota gets a Kueue quota that never binds and lends nothing;
* the cohort itself holds what is left of the cluster's capacity after the guarantees, so queues borrow it;
* every account gets the namespace ``caldera-<account>`` and in it one LocalQueue per queue, named like the queue.

A quota on ``gpu`` (no model named) is a total over every model, as on every runtime. Kueue keeps quota per flavor
and resource, and no cohort sums flavors, so the total is a resource of its own: Kueue's resource transformation
(``GPU_TOTAL_TRANSFORMATION``, in Kueue's Configuration) counts each ``nvidia.com/gpu`` a pod requests once more
as ``caldera.io/gpu-total`` (Kueue's accounting only; no node has it and no pod requests it), which every
ClusterQueue covers in the flavorless ``caldera-default`` flavor with the ``gpu`` quota. A job's GPUs are then
admitted only when both its model's flavor and the total have room. Each model's flavor keeps the ``gpu`` quota as
well (never more than the total), so Kueue still moves to the next model once one model's share is used; a quota on
``gpu/<model>`` applies to that flavor only and wins over ``gpu`` there.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from caldera.core.resources import CPU, GPU, MEMORY
from caldera.core.tenancy import QueueConfig, Quota
from caldera.runtime.kubernetes.evictions import HELD_QUEUE
from caldera.scheduler.snapshot import Reason

API_VERSION = "kueue.x-k8s.io/v1beta2"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_MODEL_LABEL = "nvidia.com/gpu.product"
GPU_TOTAL_RESOURCE = "caldera.io/gpu-total"  # every GPU of every model once more: what a model-less quota caps
# Kueue's Configuration must carry this (``resources.transformations``), else model-less quotas do not bind
GPU_TOTAL_TRANSFORMATION = {"input": GPU_RESOURCE, "strategy": "Retain", "outputs": {GPU_TOTAL_RESOURCE: "1"}}
DEFAULT_FLAVOR = "caldera-default"
MANAGED_LABEL = "caldera.io/managed-by"
MANAGER = "caldera"
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"

# Pending reason codes read from a Workload (Reason.code; stable)
KUEUE_INSUFFICIENT_QUOTA = "KueueInsufficientQuota"  # no flavor has the quota (own plus borrowable) now
KUEUE_GPU_TOTAL_USED_UP = "KueueGpuTotalUsedUp"  # the queue's model-less GPU quota (a total) has too little left
KUEUE_PENDING = "KueuePending"  # Kueue has not reserved quota yet, for a reason other than quota
KUEUE_WAITING_FOR_PODS_READY = "KueueWaitingForPodsReady"  # admitted; not all pods ready (all-or-nothing start)
KUEUE_EVICTED = "KueueEvicted"  # preempted or evicted by Kueue; requeued
KUEUE_INACTIVE = "KueueInactive"  # the workload is deactivated (e.g. too many pods-ready timeouts)

_MAX_MESSAGE = 2000
UNLIMITED = {CPU: "1M", MEMORY: "1000Ti", GPU: "1M"}  # far above any cluster this runs on (canonical forms)


def k8s_name(prefix: str, name: str) -> str:
    """A DNS-1123 label from a Caldera name; a short hash keeps names apart that differ only in characters
    Kubernetes does not allow (``_`` and ``.``)."""
    clean = re.sub(r"[^a-z0-9-]", "-", name.lower()).strip("-")
    out = f"{prefix}-{clean}" if clean else prefix
    if clean != name or len(out) > 63:
        out = f"{out[:54].rstrip('-')}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"
    return out


def namespace_for(account: str) -> str:
    return k8s_name("caldera", account)


def cluster_queue_name(queue: str) -> str:
    return k8s_name("caldera", queue)


def flavor_name(model: str) -> str:
    return k8s_name("gpu", model)


def _canonical(n: int, base: int, suffixes: tuple[str, ...]) -> str:
    """``n`` units written as the API server writes a quantity back (1000000 -> 1M, 2048Mi -> 2Gi), so applying
    the same queues again changes nothing."""
    i = 0
    while n and n % base == 0 and i + 1 < len(suffixes):
        n, i = n // base, i + 1
    return f"{n}{suffixes[i]}"


def _quantity(key: str, value: float) -> str:
    if key == MEMORY:  # MiB
        return _canonical(int(value), 1024, ("Mi", "Gi", "Ti", "Pi", "Ei"))
    if key == CPU:
        millis = int(round(value * 1000))
        return _canonical(millis // 1000, 1000, ("", "k", "M", "G")) if millis % 1000 == 0 else f"{millis}m"
    return _canonical(int(value), 1000, ("", "k", "M", "G", "T"))


def _resource(key: str, k8s_key: str, quota: Quota | None) -> dict[str, Any]:
    if quota is None:
        # no Caldera quota on it: a Kueue quota that never binds (whether it fits is the kube-scheduler's
        # question), and lends nothing, so no other queue borrows what this one does not own
        return {"name": k8s_key, "nominalQuota": UNLIMITED[key], "lendingLimit": "0"}
    q = quota
    out: dict[str, Any] = {"name": k8s_key, "nominalQuota": _quantity(key, q.guarantee)}
    if q.capability is not None:
        out["borrowingLimit"] = _quantity(key, max(0.0, q.capability - q.guarantee))
    return out


def _gpu_quota(queue: QueueConfig, model: str) -> Quota | None:
    return queue.quotas.get(f"{GPU}/{model}", queue.quotas.get(GPU))


def _fair_weight(queue: QueueConfig) -> str:
    deserved = [q.deserved for k, q in queue.quotas.items() if k.split("/")[0] == GPU and q.deserved is not None]
    weight = sum(deserved) if deserved else queue.weight
    return f"{weight:g}"


def _meta(name: str, namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {MANAGED_LABEL: MANAGER}}
    if namespace:
        meta["namespace"] = namespace
    return meta


def resource_flavors(models: Iterable[str]) -> list[dict[str, Any]]:
    out = [{"apiVersion": API_VERSION, "kind": "ResourceFlavor", "metadata": _meta(DEFAULT_FLAVOR), "spec": {}}]
    for m in sorted(set(models)):
        spec = {"nodeLabels": {GPU_MODEL_LABEL: m}}
        out.append(
            {"apiVersion": API_VERSION, "kind": "ResourceFlavor", "metadata": _meta(flavor_name(m)), "spec": spec}
        )
    return out


def _resource_groups(quota_of: Any, models: list[str]) -> list[dict[str, Any]]:
    # a flavor belongs to one resource group only: the GPU total goes with cpu and memory in the flavorless one
    covered = [(CPU, "cpu"), (MEMORY, "memory")] + ([(GPU, GPU_TOTAL_RESOURCE)] if models else [])
    default = {"name": DEFAULT_FLAVOR, "resources": [quota_of(key, k8s_key, None) for key, k8s_key in covered]}
    groups = [{"coveredResources": [k8s_key for _, k8s_key in covered], "flavors": [default]}]
    if models:
        flavors = [{"name": flavor_name(m), "resources": [quota_of(GPU, GPU_RESOURCE, m)]} for m in models]
        groups.append({"coveredResources": [GPU_RESOURCE], "flavors": flavors})
    return groups


def cohort_name(queue: QueueConfig, cohort_per: Literal["account", "cluster"]) -> str:
    return k8s_name("caldera", queue.account) if cohort_per == "account" else "caldera"


def cluster_queue(
    queue: QueueConfig, models: Iterable[str], cohort_per: Literal["account", "cluster"] = "cluster"
) -> dict[str, Any]:
    def quota_of(key: str, k8s_key: str, model: str | None) -> dict[str, Any]:
        return _resource(key, k8s_key, _gpu_quota(queue, model) if model else queue.quotas.get(key))

    spec = {
        "cohortName": cohort_name(queue, cohort_per),
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace_for(queue.account)}},
        "queueingStrategy": "BestEffortFIFO",
        "fairSharing": {"weight": _fair_weight(queue)},
        "preemption": {"reclaimWithinCohort": "Any", "withinClusterQueue": "LowerPriority"},
        "resourceGroups": _resource_groups(quota_of, sorted(set(models))),
    }
    return {
        "apiVersion": API_VERSION,
        "kind": "ClusterQueue",
        "metadata": _meta(cluster_queue_name(queue.name)),
        "spec": spec,
    }


def cohort(name: str, spare: Mapping[str, float], models: Iterable[str]) -> dict[str, Any]:
    """The cohort's own quota: ``spare`` is what the cluster has beyond the queues' guarantees (keys cpu, memory,
    gpu (the total over models), gpu/<model>); queues of the cohort borrow it up to their borrowingLimit."""

    def quota_of(key: str, k8s_key: str, model: str | None) -> dict[str, Any]:
        value = spare.get(f"{GPU}/{model}" if model else key, 0.0)  # key gpu: the total
        return {"name": k8s_key, "nominalQuota": _quantity(key, value)}

    spec = {"resourceGroups": _resource_groups(quota_of, sorted(set(models)))}
    return {"apiVersion": API_VERSION, "kind": "Cohort", "metadata": _meta(name), "spec": spec}


def local_queue(queue: QueueConfig) -> dict[str, Any]:
    spec = {"clusterQueue": cluster_queue_name(queue.name)}
    return {
        "apiVersion": API_VERSION,
        "kind": "LocalQueue",
        "metadata": _meta(queue.name, namespace_for(queue.account)),
        "spec": spec,
    }


def namespace(account: str) -> dict[str, Any]:
    meta = _meta(namespace_for(account))
    meta["labels"]["caldera.io/account"] = account
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": meta}


def translate(
    queues: Iterable[QueueConfig],
    models: Iterable[str],
    capacity: Mapping[str, float] | None = None,
    cohort_per: Literal["account", "cluster"] = "cluster",
) -> list[dict[str, Any]]:
    """Every object Caldera's queues need, in apply order. ``capacity``: the cluster's totals (cpu, memory in MiB,
    gpu/<model>); what the guarantees leave of it becomes the cohorts' own quota (per cluster only; per account,
    an account's queues borrow only from each other)."""
    queues = list(queues)
    if any(q.name == HELD_QUEUE for q in queues):
        raise ValueError(f"the queue name {HELD_QUEUE} is reserved on Kubernetes (held-back jobs wait in it)")
    models = sorted(set(models))
    objs: list[dict[str, Any]] = [namespace(a) for a in sorted({q.account for q in queues})]
    objs += resource_flavors(models)
    if capacity is not None and cohort_per == "cluster":
        spare = dict(capacity)
        spare[GPU] = sum(v for k, v in capacity.items() if k.startswith(f"{GPU}/"))
        for q in queues:
            for key in [CPU, MEMORY, GPU] + [f"{GPU}/{m}" for m in models]:
                quota = _gpu_quota(q, key.split("/", 1)[1]) if key.startswith(f"{GPU}/") else q.quotas.get(key)
                spare[key] = spare.get(key, 0.0) - (quota.guarantee if quota else 0.0)
        objs.append(cohort("caldera", {k: max(0.0, v) for k, v in spare.items()}, models))
    objs += [cluster_queue(q, models, cohort_per) for q in queues]
    objs += [local_queue(q) for q in queues]
    return objs


def apply(api_client: Any, objects: Iterable[Mapping[str, Any]]) -> None:
    """Server-side apply, so re-running it with the same queues changes nothing and a changed quota is one patch."""
    from kubernetes.dynamic import DynamicClient  # the client is imported only by the Kubernetes backend

    dyn = DynamicClient(api_client)
    for obj in objects:
        res = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        meta = obj["metadata"]
        res.server_side_apply(
            body=dict(obj),
            name=meta["name"],
            namespace=meta.get("namespace"),
            field_manager=MANAGER,
            force_conflicts=True,
        )


def sync(api_client: Any, objects: list[dict[str, Any]]) -> list[str]:
    """Apply ``objects`` and delete the Caldera-managed ClusterQueues, LocalQueues and Cohorts no longer among them
    (namespaces and flavors stay: jobs may still live in them). Returns ``kind/name`` of what was deleted."""
    from kubernetes.dynamic import DynamicClient

    apply(api_client, objects)
    wanted = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objects}
    dyn = DynamicClient(api_client)
    deleted = []
    for kind in ("LocalQueue", "ClusterQueue", "Cohort"):
        res = dyn.resources.get(api_version=API_VERSION, kind=kind)
        for item in res.get(label_selector=f"{MANAGED_LABEL}={MANAGER}").items:
            key = (kind, item.metadata.get("namespace"), item.metadata.name)
            # Kueue's finalizer keeps a deleted queue listed until its controller lets go: delete it once, not per sync
            if key not in wanted and not item.metadata.get("deletionTimestamp"):
                res.delete(name=item.metadata.name, namespace=item.metadata.get("namespace"))
                deleted.append(f"{kind}/{item.metadata.name}")
    return deleted


def _condition(conditions: list[Mapping[str, Any]], kind: str) -> Mapping[str, Any] | None:
    return next((c for c in conditions if c.get("type") == kind), None)


# "... flavor gpu-h100 doesn't match node affinity, insufficient unused quota for nvidia.com/gpu in flavor gpu-a100, 2
# more needed": the resources and flavors that lack quota (not those that merely do not fit the pod)
_SHORT_OF_QUOTA = re.compile(r"quota for ([A-Za-z0-9./_-]+) in flavor ([a-z0-9][a-z0-9.-]*[a-z0-9])")
_MORE_NEEDED = re.compile(r"(\d+) more needed")
EVICTED_BY_PREEMPTION = "Preempted"  # the Evicted condition's reason when Kueue preempted the workload


def eviction(workload: Mapping[str, Any]) -> tuple[str, str] | None:
    """(Kueue's reason, its message) when Kueue evicted the workload (condition Evicted True): ``Preempted`` (quota
    reclaimed within the cohort, or a higher priority), ``PodsReadyTimeout`` (not every pod ready in time), ..."""
    evicted = _condition(list((workload.get("status") or {}).get("conditions") or []), "Evicted")
    if evicted and evicted.get("status") == "True":
        reason = str(evicted.get("reason") or "Evicted")
        return reason, str(evicted.get("message") or f"evicted by Kueue ({reason})")[:_MAX_MESSAGE]
    return None


def counts_gpu_total(workload: Mapping[str, Any]) -> bool | None:
    """Whether Kueue counted the admitted workload's GPUs in the GPU total (its Configuration carries
    GPU_TOTAL_TRANSFORMATION); None when it is not admitted or holds no GPU."""
    assignments = ((workload.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []
    flavors = {r for a in assignments for r in (a.get("flavors") or {})}
    return GPU_TOTAL_RESOURCE in flavors if GPU_RESOURCE in flavors else None


def _count(quantity: Any) -> int:
    """A Kubernetes quantity as a whole number: the API server writes them in its own form ("1M" for the million
    that stands for an unlimited quota, "4", "500m")."""
    from kubernetes.utils.quantity import parse_quantity  # the client is this runtime's own, imported lazily

    return int(parse_quantity(quantity))


def gpu_total(cluster_queue: Mapping[str, Any] | None) -> dict[str, int]:
    """A ClusterQueue's GPU total: its quota (nominal plus what it may borrow) and what its admitted workloads
    hold, as ``quota`` and ``in_use`` (each absent when the queue does not say)."""
    out: dict[str, int] = {}
    for group in ((cluster_queue or {}).get("spec") or {}).get("resourceGroups") or []:
        for flavor in group.get("flavors") or []:
            for r in flavor.get("resources") or []:
                if r.get("name") == GPU_TOTAL_RESOURCE:
                    out["quota"] = _count(r.get("nominalQuota", 0)) + _count(r.get("borrowingLimit", 0))
    status = (cluster_queue or {}).get("status") or {}
    for flavor in status.get("flavorsReservation") or status.get("flavorsUsage") or []:
        for r in flavor.get("resources") or []:
            if r.get("name") == GPU_TOTAL_RESOURCE:
                out["in_use"] = _count(r.get("total", 0))
    return out


def _short_of_gpu_total(
    reason: Reason, workload: Mapping[str, Any], cluster_queue: Mapping[str, Any] | None
) -> Reason | None:
    """The reason a workload waits, said as what it means when it is the queue's model-less GPU quota, a total
    over every model, that has too little left: Kueue says "insufficient unused quota for caldera.io/gpu-total in
    flavor caldera-default, 2 more needed", or, for a model whose flavor is not the last it tries, names only the
    last flavor ("flavor gpu-h100 doesn't match node affinity"); then the ClusterQueue's reservations tell."""
    total = gpu_total(cluster_queue)
    requests = ((workload.get("status") or {}).get("resourceRequests")) or []
    asked = sum(_count((r.get("resources") or {}).get(GPU_TOTAL_RESOURCE, 0)) for r in requests)
    over = total["in_use"] + asked - total["quota"] if asked and {"quota", "in_use"} <= total.keys() else None
    named = _MORE_NEEDED.search(reason.message) if reason.details.get("resources") == [GPU_TOTAL_RESOURCE] else None
    if named is None and not (over and over > 0):
        return None
    details = {**reason.details, "kueue_message": reason.message, **total}
    details["needed"] = int(named.group(1)) if named else over
    message = "the queue's GPU quota, a total over every GPU model, is used up"
    if "quota" in details and "in_use" in details:
        message += f" ({details['in_use']} of {details['quota']} GPUs in use)"
    if details["needed"]:
        message += f": this job needs {details['needed']} more GPUs"
    return Reason(KUEUE_GPU_TOTAL_USED_UP, message, details)


def workload_reasons(workload: Mapping[str, Any], cluster_queue: Mapping[str, Any] | None = None) -> list[Reason]:
    """Why a Workload's job is not running, as Caldera's reasons; empty when it is admitted and its pods ready.
    ``details`` keep Kueue's own condition type and reason, so nothing Kueue said is lost. ``cluster_queue``, the
    Workload's ClusterQueue, adds its GPU total's quota and use to a reason that the total is used up."""
    spec, status = workload.get("spec") or {}, workload.get("status") or {}
    conds = list(status.get("conditions") or [])

    def reason(code: str, cond: Mapping[str, Any] | None, default: str) -> Reason:
        message = str((cond or {}).get("message") or default)[:_MAX_MESSAGE]
        details = {"source": "kueue", "condition": (cond or {}).get("type"), "kueue_reason": (cond or {}).get("reason")}
        details["workload"] = (workload.get("metadata") or {}).get("name")
        if short := _SHORT_OF_QUOTA.findall(message):
            details["flavors"] = sorted({flavor for _, flavor in short})
            details["resources"] = sorted({resource for resource, _ in short})
        return Reason(code, message, details)

    if spec.get("active") is False:
        return [reason(KUEUE_INACTIVE, _condition(conds, "Evicted"), "the workload is deactivated")]
    out = []
    evicted = _condition(conds, "Evicted")
    if evicted and evicted.get("status") == "True":
        out.append(reason(KUEUE_EVICTED, evicted, "evicted by Kueue"))
    reserved = _condition(conds, "QuotaReserved")
    if not reserved or reserved.get("status") != "True":
        message = str((reserved or {}).get("message") or "")
        code = KUEUE_INSUFFICIENT_QUOTA if "insufficient" in message or "quota" in message else KUEUE_PENDING
        waiting = reason(code, reserved, "waiting for Kueue to reserve quota")
        out.append(_short_of_gpu_total(waiting, workload, cluster_queue) or waiting)
        return out
    ready = _condition(conds, "PodsReady")
    if not ready or ready.get("status") != "True":
        out.append(reason(KUEUE_WAITING_FOR_PODS_READY, ready, "admitted; waiting for all pods to be ready"))
    return out
