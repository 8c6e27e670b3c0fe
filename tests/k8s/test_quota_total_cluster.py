"""A model-less GPU quota is a total over every model on the cluster too (issue 23, finding 1): a queue
``gpu=4:4:4`` with 2-GPU jobs of both models never holds more than 4 GPUs at once, and the jobs over it wait with
Kueue's reason."""

from __future__ import annotations

import time

from caldera.runtime.base import Phase
from caldera.runtime.kubernetes import kueue
from tests.k8s.conftest import add_queue, launch_request
from tests.runtime.conftest import wait_for


def _gpus_running(rt, handles) -> int:
    held = 0
    for h in handles:
        for pod in rt.pods.get((h.job_id, str(h.attempt))):
            if (pod.get("status") or {}).get("phase") == "Running":
                limits = pod["spec"]["containers"][0]["resources"]["limits"]
                held += int(limits.get(kueue.GPU_RESOURCE, 0))
    return held


def test_a_model_less_quota_caps_the_sum_over_models(k8s_cluster, make_rt, account):
    add_queue(k8s_cluster.api_client, account, "main", {"gpu": {"guarantee": 4, "capability": 4}})
    rt = make_rt()
    models = ["a100", "h100", "a100", "h100"]
    handles = [rt.launch(launch_request(account, "main", resources={"gpu": 2, "gpu_model": m})) for m in models]

    most, deadline = 0, time.monotonic() + 20  # long enough for Kueue to admit everything it would
    while time.monotonic() < deadline:
        most = max(most, _gpus_running(rt, handles))
        time.sleep(0.2)
    assert most == 4, f"at most {most} GPUs ran at once in a 4-GPU queue"
    running = [h for h in handles if rt.observe(h).phase is Phase.RUNNING]
    waiting = [h for h in handles if h not in running]
    assert len(running) == 2 and len(waiting) == 2
    for h in running:  # Kueue counted their GPUs in the total (its Configuration has the transformation)
        assert kueue.counts_gpu_total(rt._workload_of(rt.jobs.get((h.job_id, "1"))[0])) is True
    for h in waiting:  # Kueue has not reserved quota for them: the total is used up, whatever the job's model
        [reason] = [r for r in rt.why_pending(h) if r["details"].get("condition") == "QuotaReserved"]
        assert reason["code"] == kueue.KUEUE_GPU_TOTAL_USED_UP, reason
        assert (reason["details"]["quota"], reason["details"]["in_use"], reason["details"]["needed"]) == (4, 4, 2)
        assert rt.pods.get((h.job_id, "1")) == []

    # one ends: exactly one waiting job takes its place, whatever its model
    rt.stop(running[0], 0)
    wait_for(lambda: sum(rt.observe(h).phase is Phase.RUNNING for h in waiting) == 1, 60, what="a waiting job to run")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        assert _gpus_running(rt, handles) <= 4
        time.sleep(0.2)
    for h in handles:
        rt.stop(h, 0)
