"""Caldera's queues as Kueue objects (no cluster): a model-less GPU quota is a total over every model, held by the
GPU-total resource that Kueue's resource transformation counts; a per-model quota stays per model."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from caldera.core.tenancy import QueueConfig
from caldera.runtime.kubernetes import kueue

MODELS = ["a100", "h100"]


def _quotas(cq: dict) -> dict[tuple[str, str], dict]:
    """(flavor, resource) -> its quota entry of the ClusterQueue (or Cohort)."""
    out = {}
    for group in cq["spec"]["resourceGroups"]:
        for flavor in group["flavors"]:
            for res in flavor["resources"]:
                assert res["name"] in group["coveredResources"]
                out[(flavor["name"], res["name"])] = res
    return out


def test_a_model_less_gpu_quota_caps_the_total_over_models():
    queue = QueueConfig(name="q", account="lab", quotas={"gpu": {"guarantee": 4, "capability": 6}})
    quotas = _quotas(kueue.cluster_queue(queue, MODELS))
    total = quotas[(kueue.DEFAULT_FLAVOR, kueue.GPU_TOTAL_RESOURCE)]
    assert total == {"name": kueue.GPU_TOTAL_RESOURCE, "nominalQuota": "4", "borrowingLimit": "2"}
    # each model's flavor may hold at most as much as the total (Kueue moves on to the next model once one is full)
    for m in MODELS:
        assert quotas[(kueue.flavor_name(m), kueue.GPU_RESOURCE)]["nominalQuota"] == "4"


def test_a_per_model_quota_stays_per_model_and_the_total_does_not_bind_without_a_model_less_one():
    queue = QueueConfig(name="q", account="lab", quotas={"gpu/a100": {"guarantee": 2, "capability": 2}})
    quotas = _quotas(kueue.cluster_queue(queue, MODELS))
    assert quotas[("gpu-a100", kueue.GPU_RESOURCE)] == {
        "name": kueue.GPU_RESOURCE,
        "nominalQuota": "2",
        "borrowingLimit": "0",
    }
    for key in [("gpu-h100", kueue.GPU_RESOURCE), (kueue.DEFAULT_FLAVOR, kueue.GPU_TOTAL_RESOURCE)]:
        assert quotas[key]["nominalQuota"] == kueue.UNLIMITED["gpu"] and quotas[key]["lendingLimit"] == "0"


def test_both_a_total_and_a_per_model_quota():
    quotas = {"gpu": {"guarantee": 4, "capability": 4}, "gpu/a100": {"guarantee": 1, "capability": 1}}
    got = _quotas(kueue.cluster_queue(QueueConfig(name="q", account="lab", quotas=quotas), MODELS))
    assert got[("gpu-a100", kueue.GPU_RESOURCE)]["nominalQuota"] == "1"
    assert got[("gpu-h100", kueue.GPU_RESOURCE)]["nominalQuota"] == "4"
    assert got[(kueue.DEFAULT_FLAVOR, kueue.GPU_TOTAL_RESOURCE)]["nominalQuota"] == "4"


def test_every_flavor_is_in_one_resource_group_only():
    cq = kueue.cluster_queue(QueueConfig(name="q", account="lab", quotas={"gpu": {"guarantee": 1}}), MODELS)
    flavors = [f["name"] for g in cq["spec"]["resourceGroups"] for f in g["flavors"]]
    assert len(flavors) == len(set(flavors)) == 1 + len(MODELS)


def test_no_gpu_models_no_gpu_total():
    cq = kueue.cluster_queue(QueueConfig(name="q", account="lab"), [])
    assert [g["coveredResources"] for g in cq["spec"]["resourceGroups"]] == [["cpu", "memory"]]


def test_the_cluster_cohort_holds_the_total_the_guarantees_leave():
    queues = [
        QueueConfig(name="a", account="lab", quotas={"gpu": {"guarantee": 4}}),
        QueueConfig(name="b", account="lab", quotas={"gpu/h100": {"guarantee": 2}}),
    ]
    capacity = {"cpu": 256.0, "memory": 1024.0 * 1024, "gpu/a100": 16.0, "gpu/h100": 16.0}
    [cohort] = [o for o in kueue.translate(queues, MODELS, capacity) if o["kind"] == "Cohort"]
    quotas = _quotas(cohort)
    assert quotas[(kueue.DEFAULT_FLAVOR, kueue.GPU_TOTAL_RESOURCE)]["nominalQuota"] == "28"  # 32 - 4
    assert quotas[("gpu-h100", kueue.GPU_RESOURCE)]["nominalQuota"] == "10"  # 16 - 4 (a's share) - 2


def test_the_test_clusters_kueue_counts_the_gpu_total():
    path = Path(__file__).resolve().parents[1] / "scripts/k8s/cluster.py"
    spec = importlib.util.spec_from_file_location("k8s_cluster_script", path)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.GPU_TOTAL_TRANSFORMATION == kueue.GPU_TOTAL_TRANSFORMATION


def test_an_admitted_workload_tells_whether_kueue_counts_the_gpu_total():
    def admitted(*resources: str) -> dict:
        flavors = {r: "x" for r in resources}
        return {"status": {"admission": {"podSetAssignments": [{"name": "main", "flavors": flavors}]}}}

    assert kueue.counts_gpu_total(admitted("cpu", kueue.GPU_RESOURCE, kueue.GPU_TOTAL_RESOURCE)) is True
    assert kueue.counts_gpu_total(admitted("cpu", kueue.GPU_RESOURCE)) is False  # the site's Kueue lacks it
    assert kueue.counts_gpu_total(admitted("cpu")) is None
    assert kueue.counts_gpu_total({"status": {}}) is None


def test_the_held_back_queue_name_is_reserved():
    import pytest

    from caldera.runtime.kubernetes.evictions import HELD_QUEUE

    with pytest.raises(ValueError, match="reserved"):
        kueue.translate([QueueConfig(name=HELD_QUEUE, account="lab")], MODELS)


def _waiting(message: str, gpus: int) -> dict:
    cond = {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": message}
    requests = [{"name": "main", "resources": {kueue.GPU_TOTAL_RESOURCE: str(gpus), kueue.GPU_RESOURCE: str(gpus)}}]
    return {"metadata": {"name": "w"}, "spec": {}, "status": {"conditions": [cond], "resourceRequests": requests}}


def _cluster_queue(quota: int, reserved: int) -> dict:
    total = {"name": kueue.GPU_TOTAL_RESOURCE, "nominalQuota": str(quota), "borrowingLimit": "0"}
    usage = [{"name": kueue.DEFAULT_FLAVOR, "resources": [{"name": kueue.GPU_TOTAL_RESOURCE, "total": str(reserved)}]}]
    spec = {"resourceGroups": [{"flavors": [{"name": kueue.DEFAULT_FLAVOR, "resources": [total]}]}]}
    return {"spec": spec, "status": {"flavorsReservation": usage}}


def test_a_job_short_of_the_gpu_total_is_told_so_whatever_flavor_kueue_names_last():
    named = "couldn't assign flavors to pod set main: insufficient unused quota for caldera.io/gpu-total in flavor "
    named += "caldera-default, 2 more needed"
    [r] = kueue.workload_reasons(_waiting(named, 2), _cluster_queue(4, 4))
    assert r.code == kueue.KUEUE_GPU_TOTAL_USED_UP and (r.details["quota"], r.details["in_use"]) == (4, 4)
    assert (
        r.message.endswith("(4 of 4 GPUs in use): this job needs 2 more GPUs") and r.details["kueue_message"] == named
    )
    # Kueue names only the last flavor it tried: the ClusterQueue's reservations tell it is the total
    last = "couldn't assign flavors to pod set main: flavor gpu-h100 doesn't match node affinity"
    [r] = kueue.workload_reasons(_waiting(last, 2), _cluster_queue(4, 3))
    assert (r.code, r.details["needed"]) == (kueue.KUEUE_GPU_TOTAL_USED_UP, 1)
    # room in the total: Kueue's own reason stands (without the ClusterQueue too)
    assert kueue.workload_reasons(_waiting(last, 2), _cluster_queue(4, 2))[0].code == kueue.KUEUE_PENDING
    assert kueue.workload_reasons(_waiting(last, 2))[0].code == kueue.KUEUE_PENDING


def test_the_gpu_total_reads_quantities_as_the_api_server_writes_them():
    """The API server gives quantities back in its own form: an unlimited borrowing limit of a million is "1M"."""
    cq = {
        "spec": {
            "resourceGroups": [
                {
                    "flavors": [
                        {
                            "resources": [
                                {"name": kueue.GPU_TOTAL_RESOURCE, "nominalQuota": "4", "borrowingLimit": "1M"},
                            ]
                        }
                    ]
                }
            ]
        },
        "status": {"flavorsReservation": [{"resources": [{"name": kueue.GPU_TOTAL_RESOURCE, "total": "3"}]}]},
    }
    assert kueue.gpu_total(cq) == {"quota": 1_000_004, "in_use": 3}
