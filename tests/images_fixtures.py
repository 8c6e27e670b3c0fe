"""A real docker-registry on a free loopback port for the images tests, and settings that point at it."""

from __future__ import annotations

import shutil

import pytest

from caldera.config import Settings
from caldera.images import registry
from tests.conftest import free_port


@pytest.fixture(scope="module")
def registry_port(tmp_path_factory):
    if shutil.which("docker-registry") is None:
        pytest.skip("needs Debian's docker-registry (apt-get install docker-registry)")
    port = free_port()
    proc = registry.start_local(Settings(data_dir=tmp_path_factory.mktemp("registry"), registry_port=port))
    yield port
    proc.terminate()
    proc.wait(10)
