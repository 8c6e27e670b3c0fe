"""VS Code (code-server) in a container: the image's code-server listens on a Unix socket in the job's scratch
directory (mounted at its own path), 0600 and its owner's; the platform logs in with the password it alone keeps,
the config file that carried it is gone once it answered; an image without code-server fails at launch.

The image: the default one with the admin's code-server (scripts/install-code-server) and Node copied in, as an
image author would add them (its PATH names code-server)."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import httpx
import pytest

from caldera.config import Settings
from caldera.core.spec import JobSpec
from caldera.runtime.base import LaunchError, LaunchRequest, Phase, RunAs
from caldera.runtime.container.image import ImageInfo
from caldera.runtime.container.podman import Podman
from caldera.runtime.container.runtime import ContainerRuntime
from caldera.runtime.container.settings import ContainerSettings
from caldera.runtime.local import code_server
from tests import needs
from tests.conftest import traversable
from tests.needs import podman_usable  # noqa: F401 - fixture

from .conftest import wait_for, wait_terminal

pytestmark = pytest.mark.usefixtures("podman_usable")
ALICE = RunAs("alice", 201_003, 201_003)
IMAGE = "localhost/caldera-test/code-server:4.100.3"
_PATH = "/opt/code-server/node_modules/.bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@pytest.fixture(scope="module")
def vscode_image() -> str:
    installed = Path(needs.code_server()).parents[2]  # <dir>/node_modules/.bin/code-server
    cs = ContainerSettings()
    podman = Podman(cs.global_args())
    if ImageInfo.load(podman, cs.image) is None:
        needs.missing(f"the default image {cs.image} is missing: caldera images bootstrap")
    if ImageInfo.load(podman, IMAGE) is None:
        buildah = [needs.program("buildah", "buildah"), *cs.global_args()[1:]]
        run = lambda *a: subprocess.run([*buildah, *a], check=True, capture_output=True, text=True).stdout.strip()
        ctr = run("from", cs.image)
        try:
            run("copy", ctr, str(installed), "/opt/code-server")
            run("copy", ctr, shutil.which("node") or "/usr/bin/node", "/usr/local/bin/node")
            run("config", f"--env=PATH={_PATH}", ctr)
            run("commit", "--quiet", ctr, IMAGE)
        finally:
            run("rm", ctr)
    return IMAGE


def _launch(rt: ContainerRuntime, settings: Settings, image: str) -> tuple:
    job_id = f"ide-{uuid.uuid4().hex[:8]}"
    home = settings.workspaces / "alice"
    spec = JobSpec(name="ide", kind="vscode", image=image)
    req = LaunchRequest(job_id, 1, spec, (), workdir=home, base_url="/", run_as=ALICE, home=home)
    return rt.launch(req), home


def test_code_server_in_a_container_answers_only_the_platform_on_its_socket(vscode_image, tmp_path) -> None:
    settings = Settings(data_dir=traversable(tmp_path) / "data", node_name="ctr-node")
    rt = ContainerRuntime(settings)
    h, home = _launch(rt, settings, vscode_image)
    try:
        wait_for(lambda: rt.observe(h).phase is Phase.RUNNING, timeout=180, what="code-server to answer")
        (ep,) = rt.endpoints(h)
        assert ep.socket and ep.base_url == "/" and ep.secrets
        with httpx.Client(transport=httpx.HTTPTransport(uds=ep.socket), base_url="http://localhost") as http:
            assert http.get("/").headers["location"] == "./login"  # nothing gets in without the platform's login
            assert http.get("/", headers=ep.headers).headers["location"] == f"./?folder={home}"
            page = http.get(f"/?folder={home}", headers=ep.headers)
            assert page.status_code == 200 and "workbench" in page.text
        scratch = Path(h.data["scratch"])
        assert not (scratch / code_server.CONFIG).exists()  # read; nothing on disk lets anyone else in
        st = os.stat(ep.socket)
        assert (st.st_uid, st.st_mode & 0o777) == (ALICE.uid, 0o600)
        assert ContainerRuntime(settings).endpoints(h)  # a restarted server logs in again with its copy
    finally:
        rt.stop(h, 5)
        wait_terminal(rt, h, timeout=60)


def test_an_image_without_code_server_fails_at_launch(tmp_path) -> None:
    settings = Settings(data_dir=traversable(tmp_path) / "data", node_name="ctr-node")
    rt = ContainerRuntime(settings)
    with pytest.raises(LaunchError) as caught:
        _launch(rt, settings, ContainerSettings().image)
    assert caught.value.reason == "CodeServerMissing" and "code-server" in str(caught.value)
