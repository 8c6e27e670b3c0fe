"""A job's storage mounts on the real test cluster, through the platform: a distributed job mounting its account's
space read-only and the user's personal space writable runs with both as hostPath volumes in every rank's pod, as
the API server has them; the claim mode's manifest (subPath, read-only claim) is one the API server accepts."""

from __future__ import annotations

import dataclasses
import os

from caldera.runtime.kubernetes import manifests as m
from caldera.runtime.kubernetes.volumes import SharedRoots
from tests.k8s.conftest import launch_request, put_queue
from tests.test_runs import _submit, _until


def test_a_distributed_jobs_mounts_are_volumes_of_every_pod(k8s_cluster, platform_on_k8s):
    from kubernetes import client

    k = platform_on_k8s
    put_queue(k, k.account)
    alice = k.api.user(k.admin, "alice", accounts=[k.account])
    mounts = [
        {"space": f"account:{k.account}", "at": "/data/shared"},
        {"space": "personal", "at": "/mnt/me", "writable": True},
    ]
    jid = _submit(k.api, alice, name="mounts", kind="distributed", replicas=2, command=["sleep", "600"], mounts=mounts)
    _until(k.api, alice, jid, {"Running"})

    roots = SharedRoots.of(k.runtime.settings)
    [job] = k.runtime.jobs.get((jid, "1"))
    core = client.CoreV1Api(k8s_cluster.api_client)
    pods = core.list_namespaced_pod(job["metadata"]["namespace"], label_selector=m.selector(jid, 1)).items
    assert len(pods) == 2
    for pod in pods:  # as the API server stored them
        volumes = {v.name: v.host_path for v in pod.spec.volumes if v.host_path is not None}
        assert {name: (v.path, v.type) for name, v in volumes.items()} == {
            "space-0": (f"{roots.storage_dir}/account/{k.account}/data", "Directory"),
            "space-1": (f"{roots.workspaces}/alice", "Directory"),
        }
        seen = {v.mount_path: v for v in pod.spec.containers[0].volume_mounts}
        assert (seen["/data/shared"].read_only, seen["/data/shared"].recursive_read_only) == (True, "IfPossible")
        assert not seen["/mnt/me"].read_only and seen["/mnt/me"].recursive_read_only is None
    assert k.api.client.post(f"/api/v1/jobs/{jid}/cancel", headers=alice).status_code == 200
    _until(k.api, alice, jid, {"Cancelled"})

    # the claim mode: what the runtime would create passes the API server's validation (a dry run)
    ks = k.runtime.ks.model_copy(update={"storage_claim": "caldera-storage"})
    space = os.path.join(roots.storage_dir, "account", k.account, "data")
    req = launch_request(k.account, k.account, kind="distributed", replicas=2)
    req = dataclasses.replace(req, mounts=((space, "/data/shared", False),))
    manifest = m.build(req, ks, roots=roots)[-1]
    ns = manifest["metadata"]["namespace"]
    created = client.BatchV1Api(k8s_cluster.api_client).create_namespaced_job(ns, manifest, dry_run="All")
    pod = created.spec.template.spec
    [claim] = [v for v in pod.volumes if v.persistent_volume_claim is not None]
    assert (claim.persistent_volume_claim.claim_name, claim.persistent_volume_claim.read_only) == (
        "caldera-storage",
        True,
    )
    [mount] = [v for v in pod.containers[0].volume_mounts if v.name == claim.name]
    assert (mount.sub_path, mount.read_only) == (f"account/{k.account}/data", True)
