"""Issue 22: the ready environments' builds keep pip's downloads on the host (torch's wheels come once per host),
and users' builds never see that cache."""

from __future__ import annotations

import subprocess

import pytest

from caldera.images import ready
from caldera.images.containerfile import render
from caldera.images.form import BuildForm
from caldera.runtime.container.podman import Podman
from caldera.runtime.container.settings import ContainerSettings
from tests import needs


def test_only_the_platforms_ready_builds_use_the_hosts_pip_cache():
    users = render(BuildForm(name="mine", pip=["six"]), "caldera/base:bookworm", "r/user/ana/mine:1")
    assert "--no-cache-dir" in users and "caldera-pip" not in users
    platform = render(ready.READY["pytorch"].form("bookworm"), "caldera/base:bookworm", "caldera/pytorch:bookworm",
                      pip_cache=True)  # fmt: skip
    assert "PIP_CACHE_DIR=/run/caldera-pip pip install" in platform and "--no-cache-dir" not in platform


@pytest.fixture
def podman():
    needs.root()
    needs.podman()
    cs = ContainerSettings()
    p = Podman(cs.global_args(), str(cs.conf) if cs.conf else None, timeout_s=600)
    needs.require(p.run("images", "-q", ready.base_tag("bookworm")).strip(), "no caldera/base:bookworm image")
    return p


def test_a_ready_build_leaves_its_wheels_in_the_hosts_cache_and_the_image_has_them_installed(
    podman, tmp_path, monkeypatch
):
    monkeypatch.setattr(ready, "PIP_CACHE", tmp_path / "pip")
    env = ready.Ready("cachetest", "six", ("six==1.16.0",))
    said: list[str] = []
    tag = ready.build(podman, env, "bookworm", said.append)
    try:
        assert any(line.startswith("STEP ") for line in said)  # progress, step by step
        assert list((tmp_path / "pip").rglob("*")), "pip left nothing in the host's cache"
        out = subprocess.run([*podman.base, "run", "--rm", tag, "python", "-c", "import six; print(six.__version__)"],
                             capture_output=True, text=True, env=podman.env, timeout=120)  # fmt: skip
        assert out.stdout.strip() == "1.16.0", out.stderr
    finally:
        subprocess.run([*podman.base, "rmi", "-f", tag], capture_output=True, env=podman.env, timeout=120)
