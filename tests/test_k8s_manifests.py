"""What a job becomes on Kubernetes (caldera/runtime/kubernetes/manifests.py), checked without a cluster; the rank
launcher script of distributed pods is run for real with /bin/sh."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from caldera.core.spec import JobSpec
from caldera.runtime.base import LaunchRequest, RunAs
from caldera.runtime.kubernetes import manifests as m
from caldera.runtime.kubernetes.settings import KubernetesSettings

KS = KubernetesSettings(platform_cidr="10.0.0.5/32")
OWNER = RunAs("alice", 200_001, 200_001)


def _req(**spec: object) -> LaunchRequest:
    spec.setdefault("name", "j")
    spec.setdefault("command", ["python3", "train.py"])
    spec.setdefault("account", "physics")
    return LaunchRequest(
        job_id="ab12", attempt=2, spec=JobSpec(**spec), allocations=(), workdir=Path("/w"), run_as=OWNER
    )


def _by_kind(objs: list[dict]) -> dict[str, dict]:
    return {o["kind"]: o for o in objs}


def _env(job: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}


def test_batch_is_a_suspended_one_pod_job_in_the_accounts_namespace_and_queue():
    objs = m.build(
        _req(queue="gpu-long", resources={"cpu": 2.5, "memory_mib": 4096, "gpu": 2, "gpu_model": "a100"}), KS
    )
    assert [o["kind"] for o in objs] == ["NetworkPolicy", "Job"]  # the Job last: admitted only when all is there
    job = objs[-1]
    assert job["metadata"]["namespace"] == "caldera-physics"
    assert job["metadata"]["labels"][m.KUEUE_QUEUE] == "gpu-long"
    labels = job["metadata"]["labels"]
    assert (labels[m.LABEL_JOB], labels[m.LABEL_ATTEMPT], labels[m.LABEL_USER]) == ("ab12", "2", "alice")
    assert (labels[m.LABEL_ACCOUNT], labels[m.LABEL_QUEUE]) == ("physics", "gpu-long")
    s = job["spec"]
    assert s["suspend"] is True and s["parallelism"] == s["completions"] == 1 and "completionMode" not in s
    pod = s["template"]["spec"]
    assert pod["nodeSelector"] == {KS.gpu_model_label: "a100"}
    res = pod["containers"][0]["resources"]
    assert res["requests"] == res["limits"] == {"cpu": "2500m", "memory": "4096Mi", "nvidia.com/gpu": "2"}
    assert pod["containers"][0]["command"] == ["python3", "train.py"]
    assert pod["containers"][0]["image"] == KS.image


def test_pods_run_as_the_owner_without_privileges():
    job = m.build(_req(image="lab/torch:2.4"), KS)[-1]
    pod = job["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == OWNER.uid and pod["securityContext"]["runAsNonRoot"] is True
    sc = pod["containers"][0]["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["runAsNonRoot"] is True
    assert pod["automountServiceAccountToken"] is False
    assert pod["containers"][0]["image"] == "lab/torch:2.4"


def test_distributed_is_an_indexed_job_with_a_headless_service_naming_rank_0():
    objs = _by_kind(m.build(_req(kind="distributed", replicas=3, procs_per_replica=2), KS))
    job, svc = objs["Job"], objs["Service"]
    s = job["spec"]
    assert s["completionMode"] == "Indexed" and s["parallelism"] == s["completions"] == 3
    name = job["metadata"]["name"]
    assert s["template"]["spec"]["subdomain"] == svc["metadata"]["name"] == name
    assert svc["spec"]["clusterIP"] == "None"
    pod_labels = s["template"]["metadata"]["labels"]
    assert all(pod_labels[k] == v for k, v in svc["spec"]["selector"].items())
    env = _env(job)
    assert env["MASTER_ADDR"] == f"{name}-0.{name}.caldera-physics.svc"  # Indexed pods' host names: <job>-<index>
    assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"], env["MASTER_PORT"]) == ("6", "2", str(KS.master_port))


def _run_ranks(tmp_path: Path, index: int, per_replica: int, body: str) -> subprocess.Popen:
    job = m.build(_req(kind="distributed", replicas=2, procs_per_replica=per_replica, command=["sh", "-c", body]), KS)
    cmd = job[-1]["spec"]["template"]["spec"]["containers"][0]["command"]
    env = dict(os.environ, JOB_COMPLETION_INDEX=str(index), LOCAL_WORLD_SIZE=str(per_replica), OUT=str(tmp_path))
    return subprocess.Popen(cmd, env=env)


def test_rank_launcher_sets_each_processes_ranks_from_the_completion_index(tmp_path: Path):
    body = 'echo "$RANK $LOCAL_RANK $NODE_RANK $GROUP_RANK" > "$OUT/rank-$RANK"'
    assert _run_ranks(tmp_path, index=1, per_replica=3, body=body).wait(10) == 0
    got = sorted(p.read_text().split() for p in tmp_path.iterdir())
    assert got == [["3", "0", "1", "1"], ["4", "1", "1", "1"], ["5", "2", "1", "1"]]  # as runtime/local numbers them


def test_rank_launcher_fails_when_any_rank_fails(tmp_path: Path):
    body = '[ "$LOCAL_RANK" = 1 ] && exit 7; exit 0'
    assert _run_ranks(tmp_path, index=0, per_replica=2, body=body).wait(10) == 7


def test_rank_launcher_passes_sigterm_to_every_rank(tmp_path: Path):
    body = 'trap "touch $OUT/term-$RANK; exit 0" TERM; touch "$OUT/up-$RANK"; while :; do sleep 0.05; done'
    proc = _run_ranks(tmp_path, index=0, per_replica=2, body=body)
    deadline = time.monotonic() + 10
    while len(list(tmp_path.glob("up-*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(10) == 0
    assert sorted(p.name for p in tmp_path.glob("term-*")) == ["term-0", "term-1"]


def test_network_policy_denies_all_but_what_the_kind_needs():
    batch = _by_kind(m.build(_req(), KS))["NetworkPolicy"]["spec"]
    assert batch["policyTypes"] == ["Ingress", "Egress"] and batch["ingress"] == []
    assert [r["ports"][0]["port"] for r in batch["egress"]] == [53]  # DNS only
    dist = _by_kind(m.build(_req(kind="distributed", replicas=2), KS))["NetworkPolicy"]["spec"]
    own = {"podSelector": {"matchLabels": dist["podSelector"]["matchLabels"]}}
    assert dist["ingress"] == [{"from": [own]}] and {"to": [own]} in dist["egress"]
    lab = _by_kind(m.build(_req(kind="jupyter", command=None), KS))["NetworkPolicy"]["spec"]
    assert lab["ingress"] == [
        {"from": [{"ipBlock": {"cidr": "10.0.0.5/32"}}], "ports": [{"protocol": "TCP", "port": 8888}]}
    ]
    closed = _by_kind(m.build(_req(kind="jupyter", command=None), KubernetesSettings()))["NetworkPolicy"]["spec"]
    assert closed["ingress"] == []  # no platform address configured: nobody reaches the lab


def test_jupyter_listens_on_the_lab_port_under_the_base_url_with_the_token_from_a_secret():
    req = _req(kind="jupyter", command=None)
    req = LaunchRequest(**{**req.__dict__, "base_url": "/jobs/ab12/lab"})
    objs = _by_kind(m.build(req, KS, lab_secret="tok"))
    c = objs["Job"]["spec"]["template"]["spec"]["containers"][0]
    assert "--ServerApp.base_url=/jobs/ab12/lab/" in c["command"] and f"--port={KS.lab_port}" in c["command"]
    assert {"name": "JUPYTER_TOKEN", "valueFrom": {"secretKeyRef": {"name": "tok", "key": "token"}}} in c["env"]
    assert all(e.get("value") != "tok" for e in c["env"])
    assert "Service" not in objs  # the platform reaches the lab at its pod's IP
    secret = m.lab_token_secret(req, KS, "s3cret")
    assert secret["stringData"] == {"token": "s3cret"} and secret["metadata"]["namespace"] == "caldera-physics"


def test_vscode_serves_code_server_on_the_lab_port_logged_in_only_by_the_secrets_token():
    """code-server on the pod's lab port, reachable by the platform alone (the NetworkPolicy), with no password but
    HASHED_PASSWORD from the lab Secret: the session cookie the proxy sends. A password the job's env names is
    dropped (code-server would take it over the platform's), and so is a config file."""
    req = _req(kind="vscode", command=None, env={"PASSWORD": "mine", "HASHED_PASSWORD": "x", "FOO": "1"})
    objs = _by_kind(m.build(req, KS, lab_secret="tok"))
    c = objs["Job"]["spec"]["template"]["spec"]["containers"][0]
    assert c["command"][:4] == [
        "code-server",
        f"--bind-addr=0.0.0.0:{KS.lab_port}",
        "--auth=password",
        "--config=/dev/null",
    ]
    assert c["command"][-1] == m.WORKDIR and "--disable-telemetry" in c["command"]
    assert not any(a.startswith("--socket") for a in c["command"])
    assert c["ports"] == [{"name": "lab", "containerPort": KS.lab_port}]
    names = [e["name"] for e in c["env"]]
    assert "PASSWORD" not in names and names.count("HASHED_PASSWORD") == 1 and "JUPYTER_TOKEN" not in names
    assert {"name": "HASHED_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "tok", "key": "token"}}} in c["env"]
    assert _env(objs["Job"])["FOO"] == "1" and _env(objs["Job"])["SHELL"] == "/bin/sh"
    assert _env(m.build(_req(kind="vscode", command=None, env={"SHELL": "/bin/zsh"}), KS)[-1])["SHELL"] == "/bin/zsh"
    policy = objs["NetworkPolicy"]["spec"]
    assert policy["ingress"] == [
        {"from": [{"ipBlock": {"cidr": "10.0.0.5/32"}}], "ports": [{"protocol": "TCP", "port": KS.lab_port}]}
    ]


def test_notice_file_is_the_downward_api_view_of_the_notice_annotation():
    job = m.build(_req(), KS)[-1]
    pod = job["spec"]["template"]["spec"]
    path = _env(job)["CALDERA_PREEMPT_NOTICE"]
    mount = next(v for v in pod["containers"][0]["volumeMounts"] if v["name"] == "notice")
    item = next(v for v in pod["volumes"] if v["name"] == "notice")["downwardAPI"]["items"][0]
    assert path == f"{mount['mountPath']}/{item['path']}"
    assert item["fieldRef"]["fieldPath"] == f"metadata.annotations['{m.NOTICE_ANNOTATION}']"
    assert "preStop" in pod["containers"][0]["lifecycle"]


def test_platform_variables_win_over_the_users():
    job = m.build(_req(env={"CALDERA_JOB_ID": "forged", "FOO": "1"}), KS)[-1]
    env = _env(job)
    assert env["CALDERA_JOB_ID"] == "ab12" and env["FOO"] == "1"


@pytest.mark.parametrize("account", ["physics_lab", "a.b", "x" * 63])
def test_names_are_dns_labels_and_distinct(account: str):
    ns = m.namespace(KS, account)
    assert len(ns) <= 63 and all(c.isalnum() or c == "-" for c in ns) and ns == ns.lower()
    assert m.namespace(KS, account) != m.namespace(KS, account.replace("_", "-").replace(".", "-") + "z")
    assert m.namespace(KS, "physics_lab") != m.namespace(KS, "physics-lab")
    assert len(m.job_name("a" * 32, 12345)) <= 58


def _unknown_fields(obj: object, model: str) -> list[str]:
    """Keys of ``obj`` that the API's own schema (the official client's models) does not have, recursively."""
    import kubernetes.client.models as models

    if model.lower().startswith("list["):
        return [p for item in obj for p in _unknown_fields(item, model[5:-1])]  # type: ignore[union-attr]
    if model.lower().startswith(("dict(", "dict[")) or model in ("str", "int", "bool", "object", "float"):
        return []
    cls = getattr(models, model)
    by_json = {v: k for k, v in cls.attribute_map.items()}
    out = []
    for key, value in obj.items():  # type: ignore[union-attr]
        if key not in by_json:
            out.append(f"{model}.{key}")
        else:
            out += _unknown_fields(value, cls.openapi_types[by_json[key]])
    return out


@pytest.mark.parametrize("kind", ["batch", "distributed", "jupyter"])
def test_every_field_is_one_the_kubernetes_api_has(kind: str):
    pytest.importorskip("kubernetes")
    spec = {"kind": kind, "resources": {"gpu": 1, "gpu_model": "h100"}}
    if kind == "distributed":
        spec["replicas"] = 2
    if kind == "jupyter":
        spec["command"] = None
    models = {"Job": "V1Job", "Service": "V1Service", "NetworkPolicy": "V1NetworkPolicy", "Secret": "V1Secret"}
    objs = [*m.build(_req(**spec), KS, lab_secret="s"), m.lab_token_secret(_req(**spec), KS, "t")]
    assert [f for o in objs for f in _unknown_fields(o, models[o["kind"]])] == []


def test_an_ended_job_is_deleted_after_its_ttl_and_takes_its_objects_along():
    objs = m.build(_req(kind="distributed", replicas=2), KubernetesSettings(finished_job_ttl_s=42))
    *owned, job = objs
    assert job["kind"] == "Job" and job["spec"]["ttlSecondsAfterFinished"] == 42
    assert {o["kind"] for o in owned} == {"NetworkPolicy", "Service"}
    created = {**job, "metadata": {**job["metadata"], "uid": "0b5e7c1e-0000-4000-8000-000000000001"}}
    ref = m.owner_reference(created)
    assert ref == {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": job["metadata"]["name"],
        "uid": "0b5e7c1e-0000-4000-8000-000000000001",
        "controller": False,
    }
