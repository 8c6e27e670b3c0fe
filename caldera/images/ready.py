"""Ready environments: images a fresh install offers so that the docs' examples run without anyone writing a build
form. Each is a build form of the platform's own (the same Containerfile template as users' builds), built by an
admin's ``caldera images bootstrap`` on top of a base image and named ``caldera/<name>:<suite>``, a platform image
every job may name. Their content is fixed here, never a user's, so root's podman builds them (on the host's
network, which pip needs; a user's build runs rootless, see builds.py)."""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from caldera.images.containerfile import render
from caldera.images.form import PYTHONS, BuildForm
from caldera.runtime.container.podman import Podman

CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
BASE_NAME = "caldera/base"
_BUILD_TIMEOUT_S = 3600


class ReadyBuildFailed(RuntimeError):
    pass


@dataclass(frozen=True)
class Ready:
    name: str
    inside: str  # what a user picks it for, as the catalogue shows it
    pip: tuple[str, ...]

    def form(self, suite: str) -> BuildForm:
        python = next(v for v, s in PYTHONS.items() if s == suite)
        return BuildForm(name=self.name, python=python, jupyter=True, ssh=True, pip=list(self.pip))

    def tag(self, suite: str) -> str:
        return f"caldera/{self.name}:{suite}"


# torch from PyPI brings its CUDA 12 libraries as wheels: on a host without a GPU the same build runs on the CPU
READY = {
    "default": Ready("default", "JupyterLab, ipykernel, numpy", ("numpy",)),
    "pytorch": Ready("pytorch", "JupyterLab, PyTorch with its CUDA 12 wheels (runs on the CPU where no GPU is)",
                     ("torch", "numpy")),
}  # fmt: skip
DEFAULT_READY = ("default",)


def base_tag(suite: str) -> str:
    return f"{BASE_NAME}:{suite}"


def build(podman: Podman, ready: Ready, suite: str, say: Callable[[str], None]) -> str:
    """Builds ``ready`` on the suite's base image, printing each step of the build as it goes; returns its tag.
    Podman's layer cache makes a rebuild of an unchanged recipe a matter of seconds."""
    tag = ready.tag(suite)
    containerfile = render(ready.form(suite), base_tag(suite), tag)
    with tempfile.TemporaryDirectory(prefix="caldera-ready-") as ctx:
        (Path(ctx) / "Containerfile").write_text(containerfile)
        argv = [*podman.base, "build", "--pull=never", "--layers", "--network=host", "-v",
                f"{CA_BUNDLE}:/run/caldera-ca.crt:ro", "-t", tag, ctx]  # fmt: skip
        with subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=podman.env, text=True, errors="replace"
        ) as proc:
            tail: list[str] = []
            for line in proc.stdout or ():
                line = line.rstrip()
                tail = [*tail[-19:], line]
                if line.startswith(("STEP ", "COMMIT", "Successfully")) or "Downloading" in line:
                    say(line[:160])
            try:
                rc = proc.wait(timeout=_BUILD_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                raise ReadyBuildFailed(f"{tag}: timed out after {_BUILD_TIMEOUT_S} s") from None
    if rc != 0:
        raise ReadyBuildFailed(f"{tag}: podman build exited {rc}: " + " | ".join(tail[-5:]))
    return tag
