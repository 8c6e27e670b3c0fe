"""Jupyter Lab in a container: it listens on a Unix socket in the job's scratch directory (mounted into the
container at its own path), the platform logs in through that socket, the token file is gone once Lab is up, and
the socket is its owner's alone, as with the process runtime, so the lab proxy works unchanged.

The jobs run in the default image that `caldera images bootstrap` makes (caldera/images/ready.py)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from caldera.config import Settings
from caldera.core.spec import JobSpec
from caldera.runtime.base import LaunchRequest, Phase, RunAs
from caldera.runtime.container.image import ImageInfo
from caldera.runtime.container.podman import Podman
from caldera.runtime.container.runtime import ContainerRuntime
from caldera.runtime.container.settings import ContainerSettings
from caldera.runtime.local import jupyter
from tests import needs
from tests.conftest import traversable
from tests.needs import podman_usable  # noqa: F401 - fixture

from .conftest import wait_for, wait_terminal

pytestmark = pytest.mark.usefixtures("podman_usable")
ALICE = RunAs("alice", 201_002, 201_002)


@pytest.fixture(scope="module")
def jupyter_image() -> str:
    """The container runtime's default image, as `caldera images bootstrap` makes it: JupyterLab is in it, so the
    README's Jupyter job runs without anyone building an image first."""
    cs = ContainerSettings()
    info = ImageInfo.load(Podman(cs.global_args()), cs.image)
    if info is None:
        needs.missing(f"the default image {cs.image} is missing: caldera images bootstrap")
    assert info.missing("python3", jupyter=True) is None, f"{cs.image} has no JupyterLab"
    return cs.image


def _status(sock: str, base_url: str, cookie: str) -> int:
    conn = jupyter.UnixConnection(sock, 5)
    try:
        conn.request("GET", f"{base_url}api/status", headers={"Cookie": cookie, "Host": jupyter.HOST})
        return conn.getresponse().status
    finally:
        conn.close()


def test_lab_in_a_container_answers_only_the_platform_on_its_socket(jupyter_image, tmp_path) -> None:
    settings = Settings(data_dir=traversable(tmp_path) / "data", node_name="ctr-node")
    rt = ContainerRuntime(settings)
    job_id = f"lab-{uuid.uuid4().hex[:8]}"
    home = settings.workspaces / "alice"
    req = LaunchRequest(
        job_id,
        1,
        JobSpec(name="lab", kind="jupyter", image=jupyter_image),
        (),
        workdir=home / "jobs" / job_id,
        base_url=f"/jobs/{job_id}/lab/",
        run_as=ALICE,
        home=home,
    )
    h = rt.launch(req)
    try:
        wait_for(lambda: rt.observe(h).phase is Phase.RUNNING, timeout=180, what="Lab to answer")
        (ep,) = rt.endpoints(h)
        assert ep.socket and ep.base_url == f"/jobs/{job_id}/lab/" and ep.secrets
        assert _status(ep.socket, ep.base_url, ep.headers["Cookie"]) == 200
        assert _status(ep.socket, ep.base_url, "") == 403  # nothing gets in without the platform's login
        scratch = Path(h.data["scratch"])
        assert not (scratch / "lab-token").exists()  # Lab read it; nothing on disk lets anyone else in
        st = os.stat(ep.socket)
        assert (st.st_uid, st.st_mode & 0o777) == (ALICE.uid, 0o600)
        assert (os.stat(scratch).st_uid, os.stat(scratch).st_mode & 0o777) == (ALICE.uid, 0o700)
        # a fresh runtime (a restarted server) logs in again with its stored copy of the token
        assert ContainerRuntime(settings).endpoints(h)
    finally:
        rt.stop(h, 5)
        wait_terminal(rt, h, timeout=60)
