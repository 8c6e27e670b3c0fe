"""Pod logs copied into the platform's per-rank log store while the pod runs, so they outlive the pod.

kwok runs no containers, so no pod here prints anything by itself. What the test can make real is everything from
the kubelet API on: the test writes a container log file (CRI format, what a kubelet's runtime writes) and a kwok
``Logs`` object naming it for the pod; kwok serves it as the fake node's kubelet (containerLogs), the API server's
pods/log proxies it, and the runtime's copier follows it into ``<runs>/<job>/<attempt>/rank-<r>.log``. That the
bytes are a real container's stdout is the one part only a real node can show."""

from __future__ import annotations

import time
from pathlib import Path

from caldera.runtime.base import Phase
from tests.k8s.conftest import add_queue, launch_request
from tests.runtime.conftest import wait_for

LINES = ["step 1 loss 0.93", "step 2 loss 0.71", "naïve unicode and a long line " + "x" * 3000]


def _cri_log(path: Path, lines: list[str]) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S.000000000Z", time.gmtime())
    path.write_text("".join(f"{stamp} stdout F {line}\n" for line in lines))


def test_pod_logs_are_copied_to_the_log_store_and_survive_the_pods_deletion(k8s_cluster, make_rt, account, tmp_path):
    from kubernetes import client

    add_queue(k8s_cluster.api_client, account, "logs")
    rt = make_rt()
    handle = rt.launch(launch_request(account, "logs", resources={"cpu": 1}))
    wait_for(lambda: rt.observe(handle).phase is Phase.RUNNING, 60, what="the pod to run")
    [pod] = rt.pods.get((handle.job_id, "1"))
    name, ns = pod["metadata"]["name"], pod["metadata"]["namespace"]

    log_file = tmp_path / "container.log"
    _cri_log(log_file, LINES)
    body = {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Logs",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"logs": [{"containers": ["job"], "logsFile": str(log_file)}]},
    }
    client.CustomObjectsApi(k8s_cluster.api_client).create_namespaced_custom_object(
        "kwok.x-k8s.io", "v1alpha1", ns, "logs", body
    )
    # the API server's own pods/log answers from the fake node now
    assert (
        client.CoreV1Api(k8s_cluster.api_client).read_namespaced_pod_log(name, ns, container="job").splitlines()
        == LINES
    )

    def copied() -> bool:  # no observe() here: the copier, started by the observe() that saw the pod run and
        # refused the log then (kwok had none), follows again by itself while the pod runs
        return b"".join(rt.logs(handle)).decode().splitlines() == LINES

    wait_for(copied, 60, interval=0.5, what="the copier to have the whole log")
    rt.stop(handle, 0)
    wait_for(lambda: rt.pods.get((handle.job_id, "1")) == [], 30, what="the pod to be deleted")
    log_file.unlink()  # nothing of the source is left: what is read now comes from the platform's log store
    assert b"".join(rt.logs(handle)).decode().splitlines() == LINES
