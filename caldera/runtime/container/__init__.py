"""Container runtime: every rank in its own rootful podman container, as its owner's uid, with no capabilities, no
network, cgroup limits from its resources and only its workspace of the host. ``ContainerRuntime`` is imported
lazily, like the local runtime's."""

from __future__ import annotations

from typing import Any

__all__ = ["ContainerRuntime"]


def __getattr__(name: str) -> Any:
    if name == "ContainerRuntime":
        from caldera.runtime.container.runtime import ContainerRuntime

        return ContainerRuntime
    raise AttributeError(name)
