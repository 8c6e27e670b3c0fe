"""Kubernetes runtime figures against a running cluster (the test cluster of tests/k8s: kwok GPU nodes, Kueue):

    scripts/k8s/up --state-dir /var/tmp/caldera-k8s-bench --nodes 8 --models a100 --pods-ready-timeout 10m
    python benchmarks/k8s_startup.py --kubeconfig /var/tmp/caldera-k8s-bench/kubeconfig [--replicas 16] [--jobs 1000]

(one GPU model on all 8 nodes: Kueue gives the whole gang one flavor, so 16 x 4 GPUs need 8 nodes of one model; a
long pods-ready timeout: on 2 cores 1,000 pods take longer than the tests' 30 s to all start, and Kueue would evict).
The jobs run in the account ``bench``'s queue ``default``, made here as Kueue objects without quota.

1. Time from launch() to every pod Running for one distributed job of ``--replicas`` pods (4 GPUs each, so 16
   pods fill 8 nodes of 8 GPUs), as observe() reports it (it reads the watch cache; polled every 50 ms).
2. The API server's request rate while ``--jobs`` batch jobs run and observe() is called for every one of them
   once a second, as the platform's loop does: the difference of the API server's own ``apiserver_request_total``
   (its /metrics) over ``--window`` seconds, divided by the window. With the watch it stays near zero per job.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from caldera.config import Settings  # noqa: E402
from caldera.core.spec import JobSpec  # noqa: E402
from caldera.core.tenancy import QueueConfig  # noqa: E402
from caldera.runtime.base import Handle, LaunchRequest, Phase  # noqa: E402
from caldera.runtime.kubernetes import kueue  # noqa: E402
from caldera.runtime.kubernetes.runtime import KubernetesRuntime  # noqa: E402
from caldera.runtime.kubernetes.settings import KubernetesSettings  # noqa: E402

_REQUESTS = re.compile(r"^apiserver_request_total\{[^}]*\} ([0-9.e+]+)$", re.M)


def _req(**spec: object) -> LaunchRequest:
    spec.setdefault("name", "bench")
    spec.setdefault("command", ["true"])
    env = {"CALDERA_ACCOUNT": "bench", "CALDERA_QUEUE": "default"}
    return LaunchRequest(uuid.uuid4().hex[:12], 1, JobSpec(**spec), (), Path("/w"), env=env)


def _until_running(rt: KubernetesRuntime, handles: list[Handle], timeout: float) -> float:
    t0, deadline = time.perf_counter(), time.monotonic() + timeout
    waiting = list(handles)
    while waiting:
        if time.monotonic() > deadline:
            raise SystemExit(f"{len(waiting)} jobs not running after {timeout}s")
        waiting = [h for h in waiting if rt.observe(h).phase is not Phase.RUNNING]
        time.sleep(0.05)
    return time.perf_counter() - t0


def _api_requests(rt: KubernetesRuntime) -> float:
    resp = rt.api.call_api("GET", rt.api.configuration.host + "/metrics")
    resp.read()
    return sum(float(v) for v in _REQUESTS.findall(resp.data.decode()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kubeconfig", type=Path, required=True)
    ap.add_argument("--replicas", type=int, default=16)
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--window", type=float, default=60.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rt = KubernetesRuntime(Settings(data_dir=Path(tmp)), KubernetesSettings(kubeconfig=args.kubeconfig))
        models = sorted({d.model for n in rt.nodes() for d in n.gpus})
        kueue.apply(rt.api, kueue.translate([QueueConfig(name="default", account="bench")], models))
        t0 = time.perf_counter()
        gang = rt.launch(_req(kind="distributed", replicas=args.replicas, resources={"gpu": 4, "cpu": 1}))
        launched = time.perf_counter() - t0
        running = _until_running(rt, [gang], 300)
        print(f"distributed {args.replicas} pods: launch() {launched:.2f} s, all Running {launched + running:.2f} s")
        rt.stop(gang, 0)

        handles = [rt.launch(_req(resources={"cpu": 0.01, "memory_mib": 16})) for _ in range(args.jobs)]
        _until_running(rt, handles, 900)
        before, t_end = _api_requests(rt), time.monotonic() + args.window
        while time.monotonic() < t_end:
            for h in handles:
                rt.observe(h)
            time.sleep(1.0)
        rate = (_api_requests(rt) - before - 1) / args.window  # -1: the first /metrics read itself
        print(f"{args.jobs} running jobs, observe() each once a second: {rate:.2f} API requests/s (all clients)")
        for h in handles:
            rt.stop(h, 0)
        rt.close()


if __name__ == "__main__":
    main()
