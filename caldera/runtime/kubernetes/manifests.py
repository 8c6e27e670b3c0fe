"""A LaunchRequest as Kubernetes objects (plain dicts in the API's JSON form, so they are testable without a cluster).

batch and jupyter: a suspended Job with one pod; distributed: a suspended Indexed Job, one pod per replica, with a
headless Service so rank 0's pod has a stable DNS name. Kueue admits (unsuspends) the Job; kube-scheduler places its
pods. Every object carries the same labels, which is how the runtime finds a job again after a server restart.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

from caldera.core.spec import JobKind
from caldera.runtime.base import LaunchRequest
from caldera.runtime.kubernetes.settings import KubernetesSettings
from caldera.runtime.kubernetes.volumes import SharedRoots, space_volumes
from caldera.runtime.local import code_server

LABEL_JOB = "caldera.io/job-id"
LABEL_ATTEMPT = "caldera.io/attempt"
LABEL_USER = "caldera.io/user"
LABEL_ACCOUNT = "caldera.io/account"
LABEL_QUEUE = "caldera.io/queue"
LABEL_KIND = "caldera.io/kind"
KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
# the platform sets this annotation before it deletes a preempted job's pods; a downward-API volume shows it to the
# job as the file CALDERA_PREEMPT_NOTICE names, and the preStop hook waits until the kubelet has written it there
NOTICE_ANNOTATION = "caldera.io/preempt-notice"
NOTICE_DIR = "/run/caldera"
NOTICE_FILE = "preempt-notice"  # the local runtime's name (runtime/local/stop_record.py)
NOTICE_WAIT_S = 5  # longest the preStop hook waits for the kubelet to refresh the file
LAB_TOKEN_KEY = "token"
PER_REPLICA_ANNOTATION = "caldera.io/procs-per-replica"  # read back on re-attach: which pod's log has rank r
WORKDIR = "/work"

_NOT_DNS = re.compile(r"[^a-z0-9-]")
_NOT_LABEL = re.compile(r"[^A-Za-z0-9._-]")


def dns_label(text: str, limit: int = 63) -> str:
    """``text`` as a DNS-1123 label; a short hash keeps two names that differ only in dropped characters apart."""
    clean = _NOT_DNS.sub("-", text.lower()).strip("-") or "x"
    if clean == text and len(clean) <= limit:
        return clean
    digest = hashlib.sha256(text.encode()).hexdigest()[:8]
    return f"{clean[: limit - 9].rstrip('-')}-{digest}"


def label_value(text: str) -> str:
    clean = _NOT_LABEL.sub("_", text)[:63].strip("._-")
    return clean


def namespace(ks: KubernetesSettings, account: str) -> str:
    from caldera.runtime.kubernetes import kueue  # the account's namespace, where kueue.py makes its LocalQueue

    return kueue.namespace_for(account)


def job_name(job_id: str, attempt: int) -> str:
    # Indexed Job pods are named <job>-<index> and their host names too: room for 4 digits of index
    return dns_label(f"caldera-{job_id}-{attempt}", limit=58)


def account_of(req: LaunchRequest) -> str:
    # the platform's resolved account (the spec may leave it to the user's default)
    return req.env.get("CALDERA_ACCOUNT") or req.spec.account or "default"


def queue_of(req: LaunchRequest) -> str:
    return req.env.get("CALDERA_QUEUE") or req.spec.queue or "default"


def labels(req: LaunchRequest) -> dict[str, str]:
    spec = req.spec
    out = {
        LABEL_JOB: label_value(req.job_id),
        LABEL_ATTEMPT: str(req.attempt),
        LABEL_ACCOUNT: label_value(account_of(req)),
        LABEL_QUEUE: label_value(queue_of(req)),
        LABEL_KIND: spec.kind.value,
        "caldera.io/managed-by": "caldera",
    }
    if req.run_as is not None:
        out[LABEL_USER] = label_value(req.run_as.name)
    return out


def selector(job_id: str, attempt: int | None = None) -> str:
    """A label selector of one job's objects (of one attempt, or all of them)."""
    sel = f"{LABEL_JOB}={label_value(job_id)}"
    return sel if attempt is None else f"{sel},{LABEL_ATTEMPT}={attempt}"


def owner_reference(job: dict[str, Any]) -> dict[str, Any]:
    """An owner reference to the created Job ``job`` (the API's answer, with its uid): what carries it is deleted
    with the Job by the garbage collector."""
    meta = job["metadata"]
    return {"apiVersion": "batch/v1", "kind": "Job", "name": meta["name"], "uid": meta["uid"], "controller": False}


def build(
    req: LaunchRequest,
    ks: KubernetesSettings,
    lab_secret: str | None = None,
    grace_s: int = 30,
    roots: SharedRoots | None = None,
) -> list[dict[str, Any]]:
    """Every object of the job, in creation order (the Job last, so nothing it needs is missing when Kueue admits
    it; the others get an owner reference to it once it exists, see owner_reference). ``lab_secret``: the name of
    the Secret holding a jupyter job's token; ``grace_s``: the pods' grace between SIGTERM and SIGKILL when the
    cluster stops them (Kueue's preemption), the platform's preemption grace; ``roots``: where the storage spaces
    the job mounts may come from (volumes.py), none when it is not known."""
    ns = namespace(ks, account_of(req))
    name = job_name(req.job_id, req.attempt)
    objs: list[dict[str, Any]] = [network_policy(req, ks, ns, name)]
    if req.spec.kind is JobKind.DISTRIBUTED:
        objs.append(headless_service(req, ns, name, ks.master_port))
    objs.append(job(req, ks, ns, name, lab_secret, grace_s, roots))
    return objs


def _meta(req: LaunchRequest, ns: str, name: str) -> dict[str, Any]:
    return {"name": name, "namespace": ns, "labels": labels(req)}


def job(
    req: LaunchRequest,
    ks: KubernetesSettings,
    ns: str,
    name: str,
    lab_secret: str | None,
    grace_s: int = 30,
    roots: SharedRoots | None = None,
) -> dict[str, Any]:
    spec = req.spec
    replicas = spec.replicas if spec.kind is JobKind.DISTRIBUTED else 1
    meta = _meta(req, ns, name)
    meta["labels"][KUEUE_QUEUE] = label_value(queue_of(req))
    meta["annotations"] = {PER_REPLICA_ANNOTATION: str(spec.procs_per_replica)}
    job_spec: dict[str, Any] = {
        "suspend": True,  # Kueue admits it
        "parallelism": replicas,
        "completions": replicas,
        "backoffLimit": 0,  # a failed pod fails the job; the platform decides about a new attempt
        # the attempt's objects go with the Job (owner references): nothing of an ended attempt stays
        "ttlSecondsAfterFinished": ks.finished_job_ttl_s,
        "template": {"metadata": {"labels": labels(req)}, "spec": pod_spec(req, ks, name, lab_secret, grace_s, roots)},
    }
    if spec.kind is JobKind.DISTRIBUTED:
        job_spec["completionMode"] = "Indexed"
        job_spec["template"]["spec"]["subdomain"] = name  # <name>-<index>.<name>.<ns>.svc
    if spec.max_runtime_s is not None:
        job_spec["activeDeadlineSeconds"] = spec.max_runtime_s
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": job_spec}


def pod_spec(
    req: LaunchRequest,
    ks: KubernetesSettings,
    name: str,
    lab_secret: str | None,
    grace_s: int = 30,
    roots: SharedRoots | None = None,
) -> dict[str, Any]:
    spec = req.spec
    spaces = space_volumes(req, ks, roots, taken=[NOTICE_DIR, WORKDIR])  # in every pod: each rank sees them
    container: dict[str, Any] = {
        "name": "job",
        "image": spec.image or ks.image,
        "command": command(req, ks),
        "env": env(req, ks, name, lab_secret),
        "workingDir": WORKDIR,
        "resources": resources(req, ks),
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": [
            {"name": "notice", "mountPath": NOTICE_DIR, "readOnly": True},
            {"name": "work", "mountPath": WORKDIR},
            *spaces.mounts,
        ],
        "lifecycle": {"preStop": {"exec": {"command": ["/bin/sh", "-c", _PRESTOP]}}},
    }
    if spec.kind.interactive:
        container["ports"] = [{"name": "lab", "containerPort": ks.lab_port}]
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,  # a job has no business with the API server
        "terminationGracePeriodSeconds": grace_s,  # runtime.stop deletes with its own grace
        "securityContext": _pod_security(req, spaces.on_claim),
        "containers": [container],
        "volumes": [
            {
                "name": "notice",
                "downwardAPI": {
                    "items": [
                        {"path": NOTICE_FILE, "fieldRef": {"fieldPath": f"metadata.annotations['{NOTICE_ANNOTATION}']"}}
                    ]
                },
            },
            {"name": "work", "emptyDir": {}},
            *spaces.volumes,
        ],
    }
    if spec.resources.gpu_model:
        pod["nodeSelector"] = {ks.gpu_model_label: spec.resources.gpu_model}
    return pod


# SIGTERM comes after preStop: wait (bounded) until the kubelet has put the notice annotation into the file
_PRESTOP = (
    f'i=0; while [ ! -s {NOTICE_DIR}/{NOTICE_FILE} ] && [ "$i" -lt {NOTICE_WAIT_S * 10} ]; '
    "do sleep 0.1; i=$((i+1)); done; exit 0"
)


def _pod_security(req: LaunchRequest, on_claim: bool = False) -> dict[str, Any]:
    sc: dict[str, Any] = {"runAsNonRoot": True}
    if req.run_as is not None:
        sc.update(runAsUser=req.run_as.uid, runAsGroup=req.run_as.gid)
        # fsGroup makes the kubelet give a volume that supports it to that group, all of it: never the claim of
        # the whole storage dir (every user's files would become this job's group's)
        if not on_claim:
            sc["fsGroup"] = req.run_as.gid
    return sc


def resources(req: LaunchRequest, ks: KubernetesSettings) -> dict[str, Any]:
    r = req.spec.resources
    amounts: dict[str, str] = {"cpu": f"{int(round(r.cpu * 1000))}m", "memory": f"{r.memory_mib}Mi"}
    if r.gpu:
        amounts[ks.gpu_resource] = str(r.gpu)
    return {"requests": dict(amounts), "limits": dict(amounts)}  # limits = requests: Guaranteed QoS


def env(req: LaunchRequest, ks: KubernetesSettings, name: str, lab_secret: str | None) -> list[dict[str, Any]]:
    spec = req.spec
    values: dict[str, str] = {"PYTHONUNBUFFERED": "1"}
    if req.run_as is not None:
        values.update(USER=req.run_as.name, LOGNAME=req.run_as.name, HOME=WORKDIR)
    values.update(spec.env)
    if spec.kind is JobKind.VSCODE:  # code-server would take them over the platform's
        for overriding in code_server.OVERRIDING_ENV:
            values.pop(overriding, None)
        # its terminals' shell: the job's uid may have no passwd entry in the image to name one
        values.setdefault("SHELL", "/bin/sh")
    values.update(req.env)  # the platform's variables win over the user's
    values.update(
        CALDERA_JOB_ID=req.job_id,
        CALDERA_ATTEMPT=str(req.attempt),
        CALDERA_PREEMPT_NOTICE=f"{NOTICE_DIR}/{NOTICE_FILE}",
    )
    if spec.kind is JobKind.DISTRIBUTED:
        ns = namespace(ks, account_of(req))
        values.update(
            MASTER_ADDR=f"{name}-0.{name}.{ns}.svc",
            MASTER_PORT=str(ks.master_port),
            WORLD_SIZE=str(spec.replicas * spec.procs_per_replica),
            LOCAL_WORLD_SIZE=str(spec.procs_per_replica),
        )  # RANK, LOCAL_RANK, NODE_RANK, GROUP_RANK: from the completion index, per process (see command)
    out: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in values.items()]
    if lab_secret is not None:
        # code-server compares its session cookie with HASHED_PASSWORD as given: the token is the cookie the
        # platform's proxy sends, and no password a browser could type logs in (it is no password's hash)
        var = "HASHED_PASSWORD" if spec.kind is JobKind.VSCODE else "JUPYTER_TOKEN"
        out.append({"name": var, "valueFrom": {"secretKeyRef": {"name": lab_secret, "key": LAB_TOKEN_KEY}}})
    return out


# one process per rank of this replica, as the local runtime starts them; SIGTERM is passed on to every one, and
# the pod fails when any rank does
_RANKS = (
    'export NODE_RANK="$JOB_COMPLETION_INDEX" GROUP_RANK="$JOB_COMPLETION_INDEX"; n="$LOCAL_WORLD_SIZE"; '
    "pids=''; trap 'kill -TERM $pids 2>/dev/null' TERM; i=0; "
    'while [ "$i" -lt "$n" ]; do RANK=$((NODE_RANK * n + i)) LOCAL_RANK=$i "$@" & pids="$pids $!"; i=$((i+1)); done; '
    'rc=0; for p in $pids; do while :; do wait "$p"; s=$?; kill -0 "$p" 2>/dev/null || break; done; '
    '[ "$s" -ne 0 ] && rc=$s; done; exit $rc'
)


def command(req: LaunchRequest, ks: KubernetesSettings) -> list[str]:
    spec = req.spec
    if spec.kind is JobKind.JUPYTER:
        return lab_command(req, ks)
    if spec.kind is JobKind.VSCODE:
        return ide_command(ks)
    argv = list(spec.command or [])
    if spec.kind is JobKind.DISTRIBUTED:
        return ["/bin/sh", "-c", _RANKS, "caldera-ranks", *argv]
    return argv


def lab_command(req: LaunchRequest, ks: KubernetesSettings) -> list[str]:
    from caldera.runtime.local.jupyter import normalise_base_url

    return [
        "python3",
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ip=0.0.0.0",  # only the platform may connect: the NetworkPolicy
        f"--port={ks.lab_port}",
        f"--ServerApp.base_url={normalise_base_url(req.base_url or '/')}",
        f"--ServerApp.root_dir={WORKDIR}",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        "--LabApp.news_url=None",
    ]


def ide_command(ks: KubernetesSettings) -> list[str]:
    """code-server with the local runtimes' flags (local.code_server.argv), on the pod's lab port instead of a
    socket, with no config file (HASHED_PASSWORD in its env), at the root of the lab's origin."""
    local = code_server.argv("code-server", Path("-"), Path(WORKDIR), Path("/dev/null"))
    own = (a for a in local[1:] if not a.startswith("--socket"))
    return [local[0], f"--bind-addr=0.0.0.0:{ks.lab_port}", "--auth=password", *own]


def headless_service(req: LaunchRequest, ns: str, name: str, port: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(req, ns, name),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,  # rank 0 must be found before any readiness
            "selector": {LABEL_JOB: label_value(req.job_id), LABEL_ATTEMPT: str(req.attempt)},
            "ports": [{"name": "master", "port": port, "targetPort": port}],
        },
    }


def lab_secret_name(job: str) -> str:
    """The Secret holding the lab token of the Job named ``job``."""
    return job + "-lab"


def lab_token_secret(req: LaunchRequest, ks: KubernetesSettings, token: str) -> dict[str, Any]:
    ns = namespace(ks, account_of(req))
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _meta(req, ns, lab_secret_name(job_name(req.job_id, req.attempt))),
        "type": "Opaque",
        "stringData": {LAB_TOKEN_KEY: token},
    }


def network_policy(req: LaunchRequest, ks: KubernetesSettings, ns: str, name: str) -> dict[str, Any]:
    """Nothing in or out, except: DNS; ranks of one distributed job to each other; the platform to a lab."""
    own = {"podSelector": {"matchLabels": {LABEL_JOB: label_value(req.job_id), LABEL_ATTEMPT: str(req.attempt)}}}
    dns = {
        "to": [{"namespaceSelector": {}}],
        "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
    }
    ingress: list[dict[str, Any]] = []
    egress: list[dict[str, Any]] = [dns]
    if req.spec.kind is JobKind.DISTRIBUTED:
        ingress.append({"from": [own]})
        egress.append({"to": [own]})
    if req.spec.kind.interactive:
        peers = _platform_peers(ks)
        if peers:
            ingress.append({"from": peers, "ports": [{"protocol": "TCP", "port": ks.lab_port}]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _meta(req, ns, name),
        "spec": {
            "podSelector": own["podSelector"],
            "policyTypes": ["Ingress", "Egress"],
            "ingress": ingress,
            "egress": egress,
        },
    }


def _platform_peers(ks: KubernetesSettings) -> list[dict[str, Any]]:
    peers: list[dict[str, Any]] = []
    if ks.platform_cidr:
        peers.append({"ipBlock": {"cidr": ks.platform_cidr}})
    if ks.platform_namespace:
        peers.append({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ks.platform_namespace}}})
    return peers
