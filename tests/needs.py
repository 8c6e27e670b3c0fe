"""What the attack tests need from the host (root, podman and its base image, buildah, JupyterLab, a C compiler...).
Where something is missing a test skips, saying what; under CI (``CI=true``), which installs all of it, it fails
with the same reason instead, so a protection whose test could not run never passes as a quiet skip."""

from __future__ import annotations

import os
import shutil
from typing import NoReturn

import pytest


def under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def missing(reason: str) -> NoReturn:
    if under_ci():
        pytest.fail(f"{reason} (CI=true: the attack tests need it, so it fails instead of skipping)", pytrace=False)
    pytest.skip(reason)


def require(ok: object, reason: str) -> None:
    if not ok:
        missing(reason)


def root() -> None:
    require(os.geteuid() == 0, "jobs run as their owners only under a root server")


def podman() -> None:
    from caldera.runtime.container import probe

    require(probe.usable(), "podman or its base image is not usable here (caldera images bootstrap)")


def buildah() -> None:
    require(shutil.which("buildah"), "needs buildah")


def program(name: str, package: str) -> str:
    path = shutil.which(name)
    require(path, f"needs {name} (apt-get install {package})")
    return str(path)


def module(name: str) -> None:
    import importlib.util

    require(importlib.util.find_spec(name) is not None, f"{name} is not installed")


def code_server() -> str:
    """The code-server vscode jobs run on the process runtime (scripts/install-code-server puts it there)."""
    from caldera.config import Settings

    path = Settings.model_fields["code_server"].default
    require(os.access(path, os.X_OK), f"code-server is not installed at {path} (scripts/install-code-server)")
    return str(path)


@pytest.fixture
def podman_usable() -> None:
    """For ``pytestmark = pytest.mark.usefixtures("podman_usable")`` (import it into the module)."""
    podman()


@pytest.fixture
def buildah_usable() -> None:
    buildah()


@pytest.fixture
def root_user() -> None:
    root()
