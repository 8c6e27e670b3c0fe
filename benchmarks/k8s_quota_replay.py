"""Issue 23's figures: a replay of mixed-model jobs through the real test cluster (kube-apiserver, Kueue, kwok nodes:
two of 8 A100s, two of 8 H100s) in a queue whose quota is ``gpu=4:4:4`` (a total over models):

    scripts/k8s/up --state-dir /var/tmp/caldera-k8s-bench --nodes 4
    python benchmarks/k8s_quota_replay.py --kubeconfig /var/tmp/caldera-k8s-bench/kubeconfig [--jobs 200] [--minutes 30]

Jobs arrive at random over the first 80% of ``--minutes``, each asking for 1 or 2 GPUs of model a100, h100 or any
(model-less), with run times drawn so that the offered load is about the quota over the whole replay (the queue
stays busy). Most succeed (kwok's stage ends a pod ``caldera.io/run-seconds`` after it runs, the annotation set
here once the job runs), one in ten fails (exit 1) and one in ten is cancelled while it waits or runs.

Measured: the GPUs held by the namespace's pods (from the API, every ``--sample-s``) against the quota, the most at
once being the figure (goal: never above 4); and, once every job ended and the finished Jobs' TTL passed, the
namespace's objects (goal: none left but live attempts, and here none is live). Prints a summary and, with
``--csv``, writes the samples (seconds, GPUs in use, of them a100, h100).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kubernetes.dynamic import DynamicClient  # noqa: E402

from caldera.config import Settings  # noqa: E402
from caldera.core.spec import JobSpec  # noqa: E402
from caldera.core.tenancy import QueueConfig  # noqa: E402
from caldera.runtime.base import Handle, LaunchRequest, Phase  # noqa: E402
from caldera.runtime.kubernetes import kueue  # noqa: E402
from caldera.runtime.kubernetes.runtime import KubernetesRuntime  # noqa: E402
from caldera.runtime.kubernetes.settings import KubernetesSettings  # noqa: E402

ACCOUNT, QUEUE, QUOTA = "replay", "main", 4
KINDS = [("batch/v1", "Job"), ("v1", "Pod"), ("v1", "Service"), ("v1", "Secret")]
KINDS += [("networking.k8s.io/v1", "NetworkPolicy"), (kueue.API_VERSION, "Workload")]
ENDED = {Phase.SUCCEEDED, Phase.FAILED}


@dataclass
class Planned:
    arrive_s: float
    gpus: int
    model: str  # "" for any model
    run_s: int
    end: str  # "succeed" | "fail" | "cancel"
    handle: Handle | None = None
    noted: bool = False
    done: bool = False


def plan(jobs: int, seconds: float, seed: int) -> list[Planned]:
    rnd = random.Random(seed)
    gpus = [rnd.choice([1, 2]) for _ in range(jobs)]
    mean_run = QUOTA * seconds * 0.8 / sum(gpus)  # the offered load is about the quota while jobs arrive
    out = []
    for g in gpus:
        end = rnd.choices(["succeed", "fail", "cancel"], [8, 1, 1])[0]
        run_s = max(1, round(rnd.uniform(0.3, 1.7) * mean_run))
        out.append(Planned(rnd.uniform(0, seconds * 0.8), g, rnd.choice(["a100", "h100", ""]), run_s, end))
    return sorted(out, key=lambda p: p.arrive_s)


def request(p: Planned) -> LaunchRequest:
    resources: dict[str, object] = {"gpu": p.gpus, "cpu": 1, "memory_mib": 1024}
    if p.model:
        resources["gpu_model"] = p.model
    spec = JobSpec(name="replay", command=["true"], resources=resources)
    env = {"CALDERA_ACCOUNT": ACCOUNT, "CALDERA_QUEUE": QUEUE}
    return LaunchRequest(uuid.uuid4().hex[:12], 1, spec, (), Path("/w"), env=env)


def gpus_in_use(rt: KubernetesRuntime, ns: str) -> dict[str, int]:
    """GPUs the namespace's pods hold now, by the model of their node: every pod bound to a node and not ended
    (a pod being deleted holds its GPUs until it is gone)."""
    model_of = {n.name: n.gpus[0].model for n in rt.nodes() if n.gpus}
    held: dict[str, int] = {}
    for pod in rt.core.list_namespaced_pod(ns).items:
        if not pod.spec.node_name or pod.status.phase not in ("Pending", "Running"):
            continue
        gpus = sum(int((c.resources.limits or {}).get(kueue.GPU_RESOURCE, 0)) for c in pod.spec.containers)
        model = model_of.get(pod.spec.node_name, "?")
        held[model] = held.get(model, 0) + gpus
    return held


def namespace_objects(rt: KubernetesRuntime, ns: str) -> list[str]:
    dyn = DynamicClient(rt.api)
    return sorted(
        f"{kind}/{item.metadata.name}"
        for version, kind in KINDS
        for item in dyn.resources.get(api_version=version, kind=kind).get(namespace=ns).items
    )


def step(rt: KubernetesRuntime, p: Planned, now: float) -> None:
    """One job's part of a cycle: note its run time on its pods once it runs, cancel it when its plan says so."""
    assert p.handle is not None
    obs = rt.observe(p.handle)
    if obs.phase in ENDED:
        p.done = True
    elif p.end == "cancel" and now > p.arrive_s + p.run_s:
        rt.stop(p.handle, 0)
        p.done = True
    elif obs.phase is Phase.RUNNING and not p.noted and p.end != "cancel":
        note = {"caldera.io/run-seconds": str(p.run_s), "caldera.io/exit-code": "1" if p.end == "fail" else "0"}
        for pod in rt.pods.get((p.handle.job_id, "1")):
            meta = pod["metadata"]
            rt.core.patch_namespaced_pod(meta["name"], meta["namespace"], {"metadata": {"annotations": note}})
        p.noted = True


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kubeconfig", type=Path, required=True)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--sample-s", type=float, default=1.0)
    ap.add_argument("--ttl-s", type=int, default=30, help="finished Jobs' ttlSecondsAfterFinished")
    ap.add_argument("--seed", type=int, default=23)
    ap.add_argument("--csv", type=Path)
    args = ap.parse_args()
    jobs = plan(args.jobs, args.minutes * 60, args.seed)
    ns = kueue.namespace_for(ACCOUNT)
    with tempfile.TemporaryDirectory() as tmp:
        rt = KubernetesRuntime(
            Settings(data_dir=Path(tmp), preempt_grace_s=3),
            KubernetesSettings(kubeconfig=args.kubeconfig, finished_job_ttl_s=args.ttl_s),
        )
        queue = QueueConfig(name=QUEUE, account=ACCOUNT, quotas={"gpu": {"guarantee": QUOTA, "capability": QUOTA}})
        kueue.apply(rt.api, kueue.translate([queue], ["a100", "h100"]))
        samples: list[tuple[float, dict[str, int]]] = []
        t0 = last_sample = time.monotonic()
        while not all(p.done for p in jobs):
            now = time.monotonic() - t0
            for p in jobs:
                if p.handle is None and p.arrive_s <= now:
                    p.handle = rt.launch(request(p))
                elif p.handle is not None and not p.done:
                    step(rt, p, now)
            if time.monotonic() - last_sample >= args.sample_s:
                last_sample = time.monotonic()
                samples.append((round(now, 1), gpus_in_use(rt, ns)))
            time.sleep(0.2)
        replay_s = time.monotonic() - t0
        ended_at = time.monotonic()
        objects = namespace_objects(rt, ns)
        while objects and time.monotonic() - ended_at < args.ttl_s + 60:
            time.sleep(5)
            objects = namespace_objects(rt, ns)
        rt.close()
    most = max(sum(s.values()) for _, s in samples)
    busy = sum(sum(s.values()) for _, s in samples) / len(samples)
    ends = {e: sum(p.end == e for p in jobs) for e in ("succeed", "fail", "cancel")}
    models = {m or "any": sum(p.model == m for p in jobs) for m in ("a100", "h100", "")}
    print(f"{args.jobs} jobs ({ends}; models {models}; {sum(p.gpus for p in jobs)} GPUs asked) in {replay_s:.0f} s")
    print(f"GPUs in use: at most {most} against a quota of {QUOTA} (mean {busy:.2f}) over {len(samples)} samples")
    print(
        f"most at once by model: a100 {max(s.get('a100', 0) for _, s in samples)}, "
        f"h100 {max(s.get('h100', 0) for _, s in samples)}"
    )
    print(f"namespace objects {time.monotonic() - ended_at:.0f} s after the last job ended: {len(objects)} {objects}")
    if args.csv:
        rows = [f"{t},{sum(s.values())},{s.get('a100', 0)},{s.get('h100', 0)}" for t, s in samples]
        args.csv.write_text("seconds,gpus,a100,h100\n" + "\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
