"""A real docker-registry on a free loopback port for the images tests, and settings that point at it."""

from __future__ import annotations

import pytest

from caldera.config import Settings
from caldera.images import registry
from tests import needs
from tests.conftest import free_port


@pytest.fixture(scope="module")
def registry_port(tmp_path_factory):
    """The settings fields that reach the registry: its port and the platform's login to it."""
    needs.program("docker-registry", "docker-registry")
    port = free_port()
    s = Settings(data_dir=tmp_path_factory.mktemp("registry"), registry_port=port)
    proc = registry.start_local(s)
    yield {"registry_port": port, "registry_credentials": registry.credentials_path(s)}
    proc.terminate()
    proc.wait(10)
