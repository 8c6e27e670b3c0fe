"""A storage space is mounted into a process job only below the job's own /tmp or /var/tmp. Root runs code in the
job's mount namespace after the mounts (the supervisor, ``exec``'s helper with root's Python): a space whose files
its user chose, mounted over a directory of the host such as root's Python library, would run them as root."""

from __future__ import annotations

import os
import sys
import sysconfig

import pytest
from pydantic import ValidationError

from caldera.core.spec import JobSpec
from caldera.runtime.base import LaunchError, LaunchRequest
from caldera.runtime.container.runtime import ContainerRuntime
from caldera.runtime.local.runtime import LocalRuntime
from tests.conftest import make_settings

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="spaces are mounted by a root server only")


@pytest.mark.parametrize(
    "at",
    [sysconfig.get_paths()["stdlib"], os.path.dirname(sys.executable), "/opt", "/home", "/tmpx", "/var/lib"],
)
def test_a_space_over_a_host_directory_is_refused_before_anything_runs(settings, tmp_path, at):
    space = tmp_path / "space"
    space.mkdir()
    (space / "os.py").write_text("raise SystemExit('planted')\n")
    work = tmp_path / "work"
    req = LaunchRequest("mnt1", 1, JobSpec(name="m", command=["true"]), (), work, mounts=((str(space), at, False),))
    with pytest.raises(LaunchError) as refused:
        LocalRuntime(settings).launch(req)
    assert refused.value.reason == "MountPointRefused" and at in str(refused.value)
    assert not work.exists() or not any(work.iterdir())  # refused before a supervisor started


# The container runtime: podman binds each space at ``at`` inside the container. What runs there is the job's uid
# (its command, the env launcher, ``caldera exec``'s ``podman exec --user``), but podman's init, the launcher at
# /.caldera-env and the image's own programs are what every process there starts from; and podman makes the mount
# point of a later bind, as root, inside an earlier one. So a space is mounted only below the allowlist of
# core.spec.MOUNT_TOPS, never over or inside another mount, checked again at launch whatever the spec said.
def _container_request(tmp_path, at: str, *more: str) -> tuple[ContainerRuntime, LaunchRequest]:
    settings = make_settings(tmp_path)
    space = tmp_path / "space"
    space.mkdir(exist_ok=True)
    (space / "sh").write_text("#!/bin/sh\necho planted\n")
    home = settings.workspaces / "alice"
    mounts = tuple((str(space), a, False) for a in (at, *more))
    req = LaunchRequest("cmp1", 1, JobSpec(name="m", command=["true"]), (), home / "w", home=home, mounts=mounts)
    return ContainerRuntime(settings), req


@pytest.mark.parametrize(
    "at",
    [
        sysconfig.get_paths()["stdlib"],  # the image's Python, were the image the host's
        "/bin",  # the launcher's /bin/sh
        "/.caldera-env",  # the launcher and the job's environment values
        "/.caldera-env/launch",
        "/run/podman-init",  # podman's init, PID 1
        "/etc",
        "/home",
        "/opt",
        "/var/lib",
        "/tmpx",
        "/data/../etc",
    ],
)
def test_container_a_space_outside_the_allowlist_is_refused_before_podman_runs(tmp_path, at):
    rt, req = _container_request(tmp_path, at)
    rt.podman = None  # type: ignore[assignment]  # podman is never asked
    with pytest.raises(LaunchError) as refused:
        rt.launch(req)
    assert refused.value.reason == "MountPointRefused" and at in str(refused.value)


def test_container_a_space_over_or_inside_another_mount_is_refused(tmp_path):
    settings = make_settings(tmp_path)
    home = settings.workspaces / "alice"
    for at in (str(home), str(home / "w" / "x"), str(settings.scratch_dir / "j.1"), str(settings.scratch_dir.parent)):
        rt, req = _container_request(tmp_path, at)
        with pytest.raises(LaunchError, match="covers or lies in") as refused:
            rt.launch(req)
        assert refused.value.reason == "MountPointRefused"
    rt, req = _container_request(tmp_path, "/data", "/data/inner")
    with pytest.raises(LaunchError, match="/data/inner: covers or lies in /data"):
        rt.launch(req)
    rt, req = _container_request(tmp_path, "/data/imagenet", "/models/base")
    rt._check_mount_points(req)  # allowed: podman is asked next


def test_a_spec_mounts_only_below_the_allowlist_and_never_one_inside_another():
    def spec(*ats: str) -> JobSpec:
        return JobSpec(name="m", command=["true"], mounts=[{"space": "public", "at": a} for a in ats])

    assert [m.at for m in spec("/data/x/", "/tmp", "/mnt/a").mounts] == ["/data/x", "/tmp", "/mnt/a"]
    for ats in (("/opt",), ("/usr/lib/python3",), ("/.caldera-env",), ("/home/alice",), ("/data", "/data/x")):
        with pytest.raises(ValidationError):
            spec(*ats)
