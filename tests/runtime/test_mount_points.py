"""A storage space is mounted into a process job only below the job's own /tmp or /var/tmp. Root runs code in the
job's mount namespace after the mounts (the supervisor, ``exec``'s helper with root's Python): a space whose files
its user chose, mounted over a directory of the host such as root's Python library, would run them as root."""

from __future__ import annotations

import os
import sys
import sysconfig

import pytest

from caldera.core.spec import JobSpec
from caldera.runtime.base import LaunchError, LaunchRequest
from caldera.runtime.local.runtime import LocalRuntime

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
