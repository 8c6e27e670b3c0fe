"""An ended attempt leaves nothing in the account's namespace (issue 23, finding 4): 20 jobs that ended every way
(succeeded, failed, cancelled while running, cancelled while waiting in Kueue, distributed, a lab, evicted because
no node fits) leave only the objects of the one attempt that still runs. Every object of an attempt is owned by its
Job, and a finished Job goes ttlSecondsAfterFinished after its end (15 s here); the logs stay with the platform."""

from __future__ import annotations

import time

from kubernetes.dynamic import DynamicClient

from caldera.runtime.base import Phase
from caldera.runtime.kubernetes import kueue
from tests.k8s.conftest import add_queue, launch_request
from tests.runtime.conftest import wait_for

KINDS = [("batch/v1", "Job"), ("v1", "Pod"), ("v1", "Service"), ("v1", "Secret")]
KINDS += [("networking.k8s.io/v1", "NetworkPolicy"), (kueue.API_VERSION, "Workload")]


def _objects(api_client, ns: str) -> list[str]:
    dyn = DynamicClient(api_client)
    out = []
    for version, kind in KINDS:
        for item in dyn.resources.get(api_version=version, kind=kind).get(namespace=ns).items:
            out.append(f"{kind}/{item.metadata.name}")
    return sorted(out)


def _end_pod(rt, handle, exit_code: int) -> None:
    """kwok's stage ends a pod with the annotation caldera.io/run-seconds (tests/k8s: kwok-stages.yaml)."""
    key = (handle.job_id, str(handle.attempt))
    pods = wait_for(lambda: rt.pods.get(key), 60, what="the pods")
    note = {"caldera.io/run-seconds": "0", "caldera.io/exit-code": str(exit_code)}
    for pod in pods:
        rt.core.patch_namespaced_pod(
            pod["metadata"]["name"], pod["metadata"]["namespace"], {"metadata": {"annotations": note}}
        )


def test_ended_attempts_leave_only_the_live_ones(k8s_cluster, make_rt, account):
    add_queue(k8s_cluster.api_client, account, "main", {"gpu": {"guarantee": 32, "capability": 32}})
    add_queue(k8s_cluster.api_client, account, "none", {"gpu": {"guarantee": 0, "capability": 0}})
    rt = make_rt(k8s={"finished_job_ttl_s": 15})  # long enough to see each end under a loaded CI machine
    ns = kueue.namespace_for(account)
    launch = lambda queue="main", **spec: rt.launch(launch_request(account, queue, **spec))  # noqa: E731
    gpu = {"resources": {"gpu": 1, "gpu_model": "a100"}}

    live = launch(**gpu)
    succeeded = [launch(**gpu) for _ in range(4)]
    failed = [launch(**gpu) for _ in range(4)]
    cancelled_running = [launch(**gpu) for _ in range(4)]
    cancelled_waiting = [launch("none", **gpu) for _ in range(4)]  # never admitted: a quota of 0
    distributed = [launch(kind="distributed", replicas=2, resources={"gpu": 1, "gpu_model": "h100"}) for _ in range(2)]
    lab = launch(kind="jupyter", command=None)
    unplaceable = launch(resources={"cpu": 500})  # within quota (no cpu quota), on no node: Kueue evicts it

    running = [live, *succeeded, *failed, *cancelled_running, *distributed, lab]
    for h in running:
        try:
            wait_for(lambda h=h: rt.observe(h).phase is Phase.RUNNING, 60, what=f"{h.data['name']} to run")
        except AssertionError as e:
            raise AssertionError(f"{e}: {h.data['kind']} {rt.why_pending(h)}") from None
    for h in [*succeeded, lab]:
        _end_pod(rt, h, 0)
    for h in failed:
        _end_pod(rt, h, 3)
    for h in [*cancelled_running, *cancelled_waiting, *distributed]:
        rt.stop(h, 0)

    def ended(h, phase: Phase, reason: str | None = None) -> None:
        obs = wait_for(
            lambda: (o := rt.observe(h)).phase is not Phase.RUNNING and o.phase is not Phase.STARTING and o,
            90,
            what="the end",
        )
        assert obs.phase is phase and (reason is None or obs.reason == reason), obs

    for h in [*succeeded, lab]:
        ended(h, Phase.SUCCEEDED)
    for h in failed:
        ended(h, Phase.FAILED)
    for h in [*cancelled_running, *cancelled_waiting, *distributed]:
        ended(h, Phase.FAILED, "Stopped")
    ended(unplaceable, Phase.FAILED, "Evicted")  # the PodsReady timeout (30 s on the test cluster)

    live_objects = sorted(o for o in _objects(k8s_cluster.api_client, ns) if live.data["name"] in o)
    assert {o.split("/")[0] for o in live_objects} == {"Job", "Pod", "NetworkPolicy", "Workload"}
    deadline = time.monotonic() + 90
    while (left := _objects(k8s_cluster.api_client, ns)) != live_objects and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == live_objects, f"left behind: {sorted(set(left) - set(live_objects))}"
    # a job seen ended stays ended for the platform once its Job is gone
    assert rt.observe(succeeded[0]).phase is Phase.SUCCEEDED and rt.observe(failed[0]).phase is Phase.FAILED
