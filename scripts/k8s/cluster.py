#!/usr/bin/env python3
"""Caldera's test cluster on 127.0.0.1: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok (fake
GPU nodes) and Kueue's manager as host processes in one state folder.

    cluster.py up   [--state-dir DIR] [--nodes N] [--models a100,h100]
                                                    start (idempotent: a running cluster is left as it is)
    cluster.py down [--state-dir DIR]               stop every process it started (the state folder stays)

The binaries come from scripts/k8s/build (cached in $CALDERA_K8S_CACHE). ``up`` prints the kubeconfig path last.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

from caldera.ports import unused_port

HERE = Path(__file__).resolve().parent
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "kueue")
GPU_MODEL_LABEL = "nvidia.com/gpu.product"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
POD_CIDR = "127.244.0.0/16"
KUEUE_NAMESPACE = "kueue-system"
PORT_NAMES = (
    "etcd_client",
    "etcd_peer",
    "apiserver",
    "controller_manager",
    "scheduler",
    "kwok",
    "kueue_webhook",
    "kueue_metrics",
    "kueue_health",
)


def default_state_dir() -> Path:
    return Path(os.environ.get("CALDERA_K8S_STATE", "/var/tmp/caldera-k8s-state"))


def build_binaries() -> Path:
    out = subprocess.run([str(HERE / "build")], check=True, capture_output=True, text=True).stdout
    return Path(out.strip().splitlines()[-1])


def ports(state: Path) -> dict[str, int]:
    f = state / "ports.json"
    if f.exists():
        return {k: int(v) for k, v in json.loads(f.read_text()).items()}
    chosen = {name: unused_port() for name in PORT_NAMES}  # bound later, by each component
    f.write_text(json.dumps(chosen))
    return chosen


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_certs(pki: Path) -> None:
    """A self-made CA, the apiserver's and Kueue's webhook serving certs, the admin client cert (system:masters)
    and the service-account key pair. Made once per state folder."""
    pki.mkdir(parents=True, exist_ok=True)
    os.chmod(pki, 0o700)
    if not (pki / "ca.crt").exists():
        openssl(
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "3650",
            "-subj",
            "/CN=caldera-test-ca",
            "-keyout",
            str(pki / "ca.key"),
            "-out",
            str(pki / "ca.crt"),
        )
    certs = {
        "apiserver": ("/CN=kube-apiserver", "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc"),
        "webhook": ("/CN=kueue-webhook", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
        "kwok": ("/CN=kwok-kubelet", "subjectAltName=IP:127.0.0.1,DNS:localhost"),  # kwok's kubelet API (pod logs)
        "admin": ("/O=system:masters/CN=caldera-admin", "extendedKeyUsage=clientAuth"),
    }
    for name, (subject, ext) in certs.items():
        if (pki / f"{name}.crt").exists():
            continue
        openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            subject,
            "-keyout",
            str(pki / f"{name}.key"),
            "-out",
            str(pki / f"{name}.csr"),
        )
        (pki / f"{name}.ext").write_text(ext + "\n")
        openssl(
            "x509",
            "-req",
            "-in",
            str(pki / f"{name}.csr"),
            "-CA",
            str(pki / "ca.crt"),
            "-CAkey",
            str(pki / "ca.key"),
            "-CAcreateserial",
            "-days",
            "3650",
            "-extfile",
            str(pki / f"{name}.ext"),
            "-out",
            str(pki / f"{name}.crt"),
        )
    if not (pki / "sa.pub").exists():
        openssl("genrsa", "-out", str(pki / "sa.key"), "2048")
        openssl("rsa", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))
    webhook_dir = pki / "webhook-certs"
    webhook_dir.mkdir(exist_ok=True)
    (webhook_dir / "tls.crt").write_bytes((pki / "webhook.crt").read_bytes())
    (webhook_dir / "tls.key").write_bytes((pki / "webhook.key").read_bytes())


def write_kubeconfig(state: Path, port: int) -> Path:
    pki = state / "pki"
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "caldera-test",
                "cluster": {"server": f"https://127.0.0.1:{port}", "certificate-authority": str(pki / "ca.crt")},
            }
        ],
        "users": [
            {
                "name": "admin",
                "user": {"client-certificate": str(pki / "admin.crt"), "client-key": str(pki / "admin.key")},
            }
        ],
        "contexts": [{"name": "caldera-test", "context": {"cluster": "caldera-test", "user": "admin"}}],
        "current-context": "caldera-test",
    }
    path = state / "kubeconfig"
    path.write_text(yaml.safe_dump(cfg))
    os.chmod(path, 0o600)
    return path


def running(state: Path, name: str) -> bool:
    pidfile = state / "pids" / name
    if not pidfile.exists():
        return False
    try:
        pid = int(pidfile.read_text())
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(name.encode())
    except (ValueError, OSError):
        return False


def start(state: Path, name: str, argv: list[str]) -> None:
    if running(state, name):
        return
    (state / "pids").mkdir(exist_ok=True)
    (state / "logs").mkdir(exist_ok=True)
    env = dict(os.environ, KUBECONFIG=str(state / "kubeconfig"))
    with open(state / "logs" / f"{name}.log", "ab") as log:
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            cwd=state,
        )
    (state / "pids" / name).write_text(str(proc.pid))


def wait_until(what: str, check, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what}")


def healthy(url: str, state: Path) -> bool:
    pki = state / "pki"
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    with urllib.request.urlopen(url, context=ctx, timeout=2) as r:
        return r.status == 200


def kubectl(bin_dir: Path, state: Path, *args: str, stdin: str | None = None) -> str:
    return subprocess.run(
        [str(bin_dir / "kubectl"), "--kubeconfig", str(state / "kubeconfig"), *args],
        input=stdin,
        check=True,
        capture_output=True,
        text=True,
    ).stdout


KWOK_STAGES = ("node-initialize.yaml", "node-heartbeat-with-lease.yaml", "pod-ready.yaml")  # kwok's, from the build


def apply_crds(bin_dir: Path, state: Path, files: list[str]) -> None:
    """Apply CRDs and wait until they are served: kwok and Kueue exit when a kind they watch is unknown."""
    kubectl(bin_dir, state, "apply", "--server-side", "--force-conflicts", *[a for f in files for a in ("-f", f)])
    names = [yaml.safe_load(Path(f).read_text())["metadata"]["name"] for f in files]
    kubectl(bin_dir, state, "wait", "--for=condition=Established", "--timeout=180s", *[f"crd/{n}" for n in names])


def kwok_config(bin_dir: Path, state: Path, port: int) -> Path:
    """kwok's options and stages. Its server is the fake nodes' kubelet API (nodeIP:nodePort = 127.0.0.1:port, TLS
    by the state's CA), so the API server's pods/log reaches it; what a pod "printed" is the file a kwok ``Logs``
    object (a CRD, enableCRDs) names for it, since no container runs."""
    pki = state / "pki"
    options = {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokConfiguration",
        "options": {
            "manageAllNodes": False,
            "manageNodesWithAnnotationSelector": f"{KWOK_NODE_ANNOTATION}=fake",
            "serverAddress": f"127.0.0.1:{port}",
            "nodePort": port,
            "tlsCertFile": str(pki / "kwok.crt"),
            "tlsPrivateKeyFile": str(pki / "kwok.key"),
            "enableCRDs": ["Logs", "Exec"],
            # containerLogs; exec, where an Exec object names the pod (kwok runs the command on this host); no attach
            "enableDebuggingHandlers": True,
            # pod IPs on loopback (Linux routes all of 127/8 to lo), so a test can stand in for a pod's server
            # at its IP, as the platform's proxy reaches a lab (no container runs here)
            "cidr": POD_CIDR,
            "nodeIP": "127.0.0.1",
            "podPlayStageParallelism": 16,
            "nodePlayStageParallelism": 4,
            "nodeLeaseParallelism": 4,
            "nodeLeaseDurationSeconds": 40,
            "podsOnNodeSyncParallelism": 4,
        },
    }
    docs = [yaml.safe_dump(options)]
    docs += [(bin_dir / "kwok-stages" / name).read_text() for name in KWOK_STAGES]
    docs.append((HERE / "kwok-stages.yaml").read_text())
    path = state / "kwok.yaml"
    path.write_text("\n---\n".join(docs))
    return path


# Caldera's GPU total (kueue.GPU_TOTAL_TRANSFORMATION; a unit test keeps them equal): this script runs without caldera
GPU_TOTAL_TRANSFORMATION = {"input": "nvidia.com/gpu", "strategy": "Retain", "outputs": {"caldera.io/gpu-total": "1"}}


def kueue_config(state: Path, p: dict[str, int], pods_ready_timeout: str) -> Path:
    cfg = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{p['kueue_health']}"},
        "metrics": {"bindAddress": f"127.0.0.1:{p['kueue_metrics']}"},
        "webhook": {"host": "127.0.0.1", "port": p["kueue_webhook"], "certDir": str(state / "pki" / "webhook-certs")},
        "leaderElection": {"leaderElect": False},
        "clientConnection": {"qps": 200, "burst": 400},  # as the controller-manager's: room for 1,000 jobs
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        # all-or-nothing start: an admitted job whose pods are not all ready within the timeout is evicted and
        # requeued (short here so a test sees it; sites use minutes)
        "waitForPodsReady": {
            "timeout": pods_ready_timeout,
            "blockAdmission": False,
            "requeuingStrategy": {"timestamp": "Eviction", "backoffBaseSeconds": 10},
        },
        "integrations": {"frameworks": ["batch/job"]},
        # each GPU counted once more as Caldera's GPU total, so a model-less quota caps the sum over models
        # (caldera/runtime/kubernetes/kueue.py; a site's Kueue needs the same)
        "resources": {"transformations": [GPU_TOTAL_TRANSFORMATION]},
        "fairSharing": {"preemptionStrategies": ["LessThanOrEqualToFinalShare", "LessThanInitialShare"]},
        # the on-demand visibility API is an aggregated API server with certificates of its own (a fixed path);
        # Caldera reads a Workload's conditions instead
        "featureGates": {"VisibilityOnDemand": False},
    }
    path = state / "kueue-config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def kueue_webhooks(bin_dir: Path, state: Path, port: int) -> str:
    """Kueue's webhook configurations pointed at the host process by URL, for Kueue's own objects and batch Jobs
    only (a registered webhook for a framework Kueue does not serve would refuse those objects)."""
    ca = base64.b64encode((state / "pki" / "ca.crt").read_bytes()).decode()
    docs = [d for d in yaml.safe_load_all((bin_dir / "kueue-webhooks.yaml").read_text()) if d]
    for doc in docs:
        doc["metadata"]["name"] = "kueue-" + doc["metadata"]["name"]
        kept = []
        for hook in doc.get("webhooks", []):
            path = hook["clientConfig"]["service"]["path"]
            if "kueue-x-k8s-io" in path or "batch-v1-job" in path:
                hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca}
                kept.append(hook)
        doc["webhooks"] = kept
    return "\n---\n".join(yaml.safe_dump(d) for d in docs)


def fake_node(name: str, model: str) -> dict:
    # pods 250 (a kubelet's default is 110): room for the benchmark's 1,000 one-pod jobs on 8 nodes
    capacity = {"cpu": "64", "memory": "512Gi", "pods": "250", "nvidia.com/gpu": "8"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_NODE_ANNOTATION: "fake"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "type": "kwok",
                GPU_MODEL_LABEL: model,
                "nvidia.com/gpu.count": "8",
            },
        },
        "spec": {},
        "status": {"allocatable": capacity, "capacity": capacity},
    }


def node_models(count: int, models: list[str]) -> list[tuple[str, str]]:
    """The fake nodes, the models in equal runs: with a100,h100 the first half A100, the rest H100."""
    per = max(1, -(-count // len(models)))
    return [(f"gpu-node-{i}", models[min(i // per, len(models) - 1)]) for i in range(count)]


def up(state: Path, nodes: int, models: list[str], pods_ready_timeout: str = "30s") -> Path:
    state.mkdir(parents=True, exist_ok=True)
    bin_dir = build_binaries()
    p = ports(state)
    make_certs(state / "pki")
    kubeconfig = write_kubeconfig(state, p["apiserver"])
    pki = state / "pki"
    api = f"https://127.0.0.1:{p['apiserver']}"
    start(
        state,
        "etcd",
        [
            str(bin_dir / "etcd"),
            "--name",
            "caldera",
            "--data-dir",
            str(state / "etcd"),
            "--listen-client-urls",
            f"http://127.0.0.1:{p['etcd_client']}",
            "--advertise-client-urls",
            f"http://127.0.0.1:{p['etcd_client']}",
            "--listen-peer-urls",
            f"http://127.0.0.1:{p['etcd_peer']}",
            "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{p['etcd_peer']}",
            "--initial-cluster",
            f"caldera=http://127.0.0.1:{p['etcd_peer']}",
            "--quota-backend-bytes",
            str(2 << 30),
            "--unsafe-no-fsync",
        ],
    )
    start(
        state,
        "kube-apiserver",
        [
            str(bin_dir / "kube-apiserver"),
            "--etcd-servers",
            f"http://127.0.0.1:{p['etcd_client']}",
            "--bind-address",
            "127.0.0.1",
            "--advertise-address",
            "127.0.0.1",
            "--secure-port",
            str(p["apiserver"]),
            "--endpoint-reconciler-type",
            "none",
            "--authorization-mode",
            "Node,RBAC",
            "--client-ca-file",
            str(pki / "ca.crt"),
            "--tls-cert-file",
            str(pki / "apiserver.crt"),
            "--tls-private-key-file",
            str(pki / "apiserver.key"),
            "--service-account-key-file",
            str(pki / "sa.pub"),
            "--service-account-signing-key-file",
            str(pki / "sa.key"),
            "--service-account-issuer",
            "https://kubernetes.default.svc",
            "--service-cluster-ip-range",
            "10.96.0.0/16",
            "--kubelet-preferred-address-types",
            "InternalIP",
            "--kubelet-certificate-authority",
            str(pki / "ca.crt"),
            "--kubelet-client-certificate",
            str(pki / "apiserver.crt"),
            "--kubelet-client-key",
            str(pki / "apiserver.key"),
            "--allow-privileged=false",
            "--profiling=false",
            "--enable-priority-and-fairness=false",
        ],
    )
    wait_until("kube-apiserver", lambda: healthy(f"{api}/readyz", state), timeout=120)
    common = ["--kubeconfig", str(kubeconfig), "--bind-address", "127.0.0.1", "--leader-elect=false"]
    start(
        state,
        "kube-controller-manager",
        [
            str(bin_dir / "kube-controller-manager"),
            *common,
            "--secure-port",
            str(p["controller_manager"]),
            "--service-account-private-key-file",
            str(pki / "sa.key"),
            "--root-ca-file",
            str(pki / "ca.crt"),
            "--use-service-account-credentials=false",
            "--concurrent-job-syncs",
            "20",
            # its default 20 requests/s makes 1,000 jobs queue for minutes (and Kueue's pods-ready timeout evict them)
            "--kube-api-qps",
            "200",
            "--kube-api-burst",
            "400",
        ],
    )
    start(state, "kube-scheduler", [str(bin_dir / "kube-scheduler"), *common, "--secure-port", str(p["scheduler"])])
    kwok_crds = sorted(str(f) for f in (bin_dir / "kwok-crds").glob("*.yaml"))
    apply_crds(bin_dir, state, kwok_crds)
    start(
        state,
        "kwok",
        [
            str(bin_dir / "kwok"),
            "--kubeconfig",
            str(kubeconfig),
            "--config",
            str(kwok_config(bin_dir, state, p["kwok"])),
        ],
    )
    crds = sorted(str(f) for f in (bin_dir / "kueue-crds").glob("*.yaml"))
    apply_crds(bin_dir, state, crds)
    kubectl(
        bin_dir,
        state,
        "apply",
        "--server-side",
        "-f",
        "-",
        stdin=yaml.safe_dump({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KUEUE_NAMESPACE}}),
    )
    # Kueue reads the kubeconfig from KUBECONFIG, which start() sets for every component; without its internal
    # cert management it serves metrics with a certificate from a fixed path (no option moves it): any will do
    metrics_certs = Path("/etc/kueue/metrics/certs")
    if not (metrics_certs / "tls.key").exists():
        metrics_certs.mkdir(parents=True, exist_ok=True)
        (metrics_certs / "tls.crt").write_bytes((pki / "webhook.crt").read_bytes())
        (metrics_certs / "tls.key").write_bytes((pki / "webhook.key").read_bytes())
        os.chmod(metrics_certs / "tls.key", 0o600)
    start(state, "kueue", [str(bin_dir / "kueue"), "--config", str(kueue_config(state, p, pods_ready_timeout))])
    wait_until(
        "kueue",
        lambda: urllib.request.urlopen(f"http://127.0.0.1:{p['kueue_health']}/readyz", timeout=2).status == 200,
        timeout=120,
    )
    kubectl(
        bin_dir,
        state,
        "apply",
        "--server-side",
        "--force-conflicts",
        "-f",
        "-",
        stdin=kueue_webhooks(bin_dir, state, p["kueue_webhook"]),
    )
    nodes_yaml = "\n---\n".join(yaml.safe_dump(fake_node(n, m)) for n, m in node_models(nodes, models))
    kubectl(bin_dir, state, "apply", "--server-side", "-f", "-", stdin=nodes_yaml)
    wait_until(
        "nodes Ready",
        lambda: kubectl(bin_dir, state, "wait", "--for=condition=Ready", "node", "--all", "--timeout=5s") is not None,
        timeout=60,
    )
    (state / "bin").unlink(missing_ok=True)
    (state / "bin").symlink_to(bin_dir)
    return kubeconfig


def down(state: Path) -> None:
    for name in reversed(COMPONENTS):
        if running(state, name):
            pid = int((state / "pids" / name).read_text())
            os.killpg(pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and running(state, name):
                time.sleep(0.1)
            if running(state, name):
                os.killpg(pid, signal.SIGKILL)
        (state / "pids" / name).unlink(missing_ok=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["up", "down"])
    ap.add_argument("--state-dir", type=Path, default=default_state_dir())
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--models", default="a100,h100", help="GPU models of the nodes, in equal runs")
    ap.add_argument("--pods-ready-timeout", default="30s", help="Kueue's waitForPodsReady timeout (e.g. 5m)")
    args = ap.parse_args()
    state = args.state_dir.resolve()
    if args.command == "down":
        down(state)
        return
    t0 = time.monotonic()
    kubeconfig = up(state, args.nodes, [m for m in args.models.split(",") if m], args.pods_ready_timeout)
    print(f"cluster up in {time.monotonic() - t0:.1f}s; state {state}", file=sys.stderr)
    print(f"use it: export KUBECONFIG={kubeconfig}; {state}/bin/kubectl get nodes", file=sys.stderr)
    print(kubeconfig)


if __name__ == "__main__":
    main()
