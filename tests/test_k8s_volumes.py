"""Storage spaces a job mounts, as Kubernetes volumes (caldera/runtime/kubernetes/volumes.py), checked without a
cluster: hostPath volumes by default, one PersistentVolumeClaim with a subPath per mount when configured; read-only
unless writable; in the pod template every rank's pod is made from; and, from the attacker's side, nothing a user
gives becomes a hostPath or a subPath, and no mount lands on another one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from caldera.core.spec import JobSpec
from caldera.runtime.base import LaunchError, LaunchRequest, RunAs
from caldera.runtime.kubernetes import manifests as m
from caldera.runtime.kubernetes.settings import KubernetesSettings
from caldera.runtime.kubernetes.volumes import SharedRoots

OWNER = RunAs("alice", 200_001, 200_001)
KS = KubernetesSettings()
CLAIM = KubernetesSettings(storage_claim="caldera-storage")


@pytest.fixture
def roots(tmp_path: Path) -> SharedRoots:
    """A storage dir and a workspaces dir as the platform lays them out (the resolver's real, linkless paths)."""
    for d in ("storage/account/vision/data", "storage/catalogue/7/data", "storage/public/data", "workspaces/alice"):
        (tmp_path / d).mkdir(parents=True)
    return SharedRoots(os.path.realpath(tmp_path / "storage"), os.path.realpath(tmp_path / "workspaces"))


def _req(mounts: list[tuple[str, str, bool]], **spec: object) -> LaunchRequest:
    spec.setdefault("name", "j")
    spec.setdefault("command", ["python3", "train.py"])
    spec.setdefault("account", "vision")
    job = JobSpec(**spec)
    return LaunchRequest("ab12", 1, job, (), Path("/w"), run_as=OWNER, mounts=tuple(mounts))


def _pod(req: LaunchRequest, ks: KubernetesSettings, roots: SharedRoots | None) -> dict:
    return m.build(req, ks, roots=roots)[-1]["spec"]["template"]["spec"]


def _spaces(pod: dict) -> tuple[dict[str, dict], dict[str, dict]]:
    """The pod's volumes and the job container's volumeMounts other than the platform's own, by name/path."""
    volumes = {v["name"]: v for v in pod["volumes"] if v["name"] not in ("notice", "work")}
    mounts = {v["mountPath"]: v for v in pod["containers"][0]["volumeMounts"] if v["name"] not in ("notice", "work")}
    return volumes, mounts


def test_host_path_mode_mounts_each_folder_read_only_unless_writable(roots):
    account, personal = f"{roots.storage_dir}/account/vision/data", f"{roots.workspaces}/alice"
    pod = _pod(_req([(account, "/data/vision", False), (personal, "/shared/me", True)]), KS, roots)
    volumes, mounts = _spaces(pod)
    assert volumes == {
        "space-0": {"name": "space-0", "hostPath": {"path": account, "type": "Directory"}},
        "space-1": {"name": "space-1", "hostPath": {"path": personal, "type": "Directory"}},
    }
    assert mounts["/data/vision"] == {
        "name": "space-0",
        "mountPath": "/data/vision",
        "readOnly": True,
        "recursiveReadOnly": "IfPossible",
    }
    assert mounts["/shared/me"] == {"name": "space-1", "mountPath": "/shared/me", "readOnly": False}
    assert pod["securityContext"]["fsGroup"] == OWNER.gid  # hostPath volumes are never given to a group
    # the platform's own mounts are still there, unchanged
    names = [v["name"] for v in pod["containers"][0]["volumeMounts"]]
    assert names[:2] == ["notice", "work"]


def test_claim_mode_mounts_subpaths_of_one_claim_and_never_regroups_the_storage(roots):
    account, model = f"{roots.storage_dir}/account/vision/data", f"{roots.storage_dir}/catalogue/7/data"
    pod = _pod(_req([(model, "/models/base", False), (account, "/shared", True)]), CLAIM, roots)
    volumes, mounts = _spaces(pod)
    # one volume of the claim, writable since one mount is; each mount says itself whether it may write
    assert volumes == {
        "storage": {"name": "storage", "persistentVolumeClaim": {"claimName": "caldera-storage", "readOnly": False}}
    }
    assert mounts["/models/base"] == {
        "name": "storage",
        "mountPath": "/models/base",
        "readOnly": True,
        "recursiveReadOnly": "IfPossible",
        "subPath": "catalogue/7/data",
    }
    assert mounts["/shared"] == {
        "name": "storage",
        "mountPath": "/shared",
        "readOnly": False,
        "subPath": "account/vision/data",
    }
    # fsGroup would make the kubelet give the whole storage dir (every user's files) to this job's group
    assert "fsGroup" not in pod["securityContext"] and pod["securityContext"]["runAsGroup"] == OWNER.gid

    only_read = _pod(_req([(model, "/models/base", False)]), CLAIM, roots)
    assert _spaces(only_read)[0]["storage"]["persistentVolumeClaim"]["readOnly"] is True
    assert "storage" not in _spaces(_pod(_req([]), CLAIM, roots))[0]  # no mounts: no claim, fsGroup as before
    assert _pod(_req([]), CLAIM, roots)["securityContext"]["fsGroup"] == OWNER.gid


def test_claim_mode_refuses_what_lies_outside_the_storage_dir(roots):
    personal = f"{roots.workspaces}/alice"  # personal spaces are not on the claim
    with pytest.raises(LaunchError) as e:
        _pod(_req([(personal, "/shared/me", True)]), CLAIM, roots)
    assert e.value.reason == "MountSourceRefused" and roots.storage_dir in str(e.value)


def test_every_rank_of_a_distributed_job_mounts_them(roots):
    account = f"{roots.storage_dir}/account/vision/data"
    for ks in (KS, CLAIM):
        job = m.build(_req([(account, "/data", False)], kind="distributed", replicas=3), ks, roots=roots)[-1]
        assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["parallelism"] == 3
        # an Indexed Job makes each of its pods from this one template
        _, mounts = _spaces(job["spec"]["template"]["spec"])
        assert mounts["/data"]["readOnly"] is True


@pytest.mark.parametrize(
    "at, why",
    [
        ("/work", "only below"),  # the job's working directory
        ("/work/data", "only below"),
        ("/run/caldera", "only below"),  # the preemption notice
        ("/etc", "only below"),
        ("/data/../etc", "only below"),  # not normalised
        ("/data/", "only below"),
        ("/data/a/b", "covers or lies in /data/a"),  # inside the other space
        ("/data", "covers or lies in /data/a"),  # over it
        ("/data/a", "covers or lies in /data/a"),  # the same place
    ],
)
def test_a_mount_point_on_the_platforms_or_another_mount_is_refused(roots, at, why):
    account = f"{roots.storage_dir}/account/vision/data"
    public = f"{roots.storage_dir}/public/data"
    for ks in (KS, CLAIM):
        with pytest.raises(LaunchError) as e:
            _pod(_req([(public, "/data/a", False), (account, at, True)]), ks, roots)
        assert e.value.reason == "MountPointRefused" and why in str(e.value)


def test_no_host_path_but_the_platforms_storage_becomes_a_volume(roots, tmp_path):
    """The host path comes from the platform's resolver; the runtime, the boundary, still mounts nothing outside
    the storage roots: not another folder of the host, not a path that climbs out, not the roots themselves, not a
    link planted on the way, and nothing when it does not know the roots."""
    (tmp_path / "storage/account/vision/data/out").symlink_to("/etc")
    bad = [
        "/etc",
        "/",
        "relative/path",
        f"{roots.storage_dir}/account/../../../etc",
        f"{roots.storage_dir}/account/vision/data/",
        roots.storage_dir,  # every space at once
        roots.workspaces,
        f"{roots.storage_dir}/account/vision/data/out",  # a link to /etc
        f"{roots.storage_dir}-evil/x",  # beside the root, sharing its name's start
    ]
    for host in bad:
        for ks in (KS, CLAIM):
            with pytest.raises(LaunchError) as e:
                _pod(_req([(host, "/data", False)]), ks, roots)
            assert e.value.reason == "MountSourceRefused", host
    with pytest.raises(LaunchError) as e:
        _pod(_req([(f"{roots.storage_dir}/public/data", "/data", False)]), KS, None)
    assert e.value.reason == "MountSourceRefused"


def test_volume_names_are_the_runtimes_own_dns_labels(roots):
    """Nothing of a name the user chose (a space, a dataset, a path) names a volume: space-<i> and storage, unique,
    valid DNS labels, never the platform's notice and work."""
    account = f"{roots.storage_dir}/account/vision/data"
    many = [(account, f"/mnt/m{i}", i % 2 == 0) for i in range(12)]
    volumes, mounts = _spaces(_pod(_req(many), KS, roots))
    assert sorted(volumes) == sorted(f"space-{i}" for i in range(12))
    assert all(m.dns_label(name) == name for name in volumes)
    assert [mounts[f"/mnt/m{i}"]["readOnly"] for i in range(12)] == [i % 2 == 1 for i in range(12)]
