"""The container runtime's own settings, from CALDERA_CONTAINER_* variables (e.g. CALDERA_CONTAINER_IMAGE)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

# a ready environment (caldera/images/ready.py) with JupyterLab, made by `caldera images bootstrap`
DEFAULT_IMAGE = "caldera/default:bookworm"


class ContainerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CALDERA_CONTAINER_", extra="ignore")

    podman: str = Field("podman", description="the podman binary")
    root: Path | None = Field(None, description="podman --root (image and container storage); podman's when empty")
    runroot: Path | None = Field(None, description="podman --runroot (state); podman's default when empty")
    tmpdir: Path | None = Field(None, description="podman --tmpdir; podman's default when empty")
    conf: Path | None = Field(None, description="a containers.conf for podman (CONTAINERS_CONF); the host's when empty")
    image: str = Field(DEFAULT_IMAGE, description="the image of jobs whose spec names none")
    network: str = Field("none", description="podman --network of jobs; 'none' leaves them only loopback")
    pids_limit: int = Field(4096, ge=16, description="processes and threads per rank")
    command_timeout_s: float = Field(120.0, gt=0, description="longest wait for one podman command")

    def global_args(self) -> list[str]:
        args = [self.podman]
        for flag, value in (("--root", self.root), ("--runroot", self.runroot), ("--tmpdir", self.tmpdir)):
            if value is not None:
                args += [flag, str(value)]
        return args
