"""Runtimes by name (setting ``runtime``), registered as entry points in the ``caldera.runtimes`` group, the way
JupyterHub finds spawners: a site's own backend is a package that declares one, nothing here changes.

A runtime is a class taking the platform's Settings; it imports its own client libraries lazily.
"""

from __future__ import annotations

from importlib.metadata import entry_points

from caldera.config import Settings
from caldera.runtime.base import Runtime

GROUP = "caldera.runtimes"


def available() -> list[str]:
    return sorted(ep.name for ep in entry_points(group=GROUP))


def default_name() -> str:
    """``container`` where podman can run jobs (root, podman working, the default image present), else ``local``:
    the setting ``runtime`` when nobody chose one."""
    from caldera.runtime.container import probe

    return "container" if probe.usable() else "local"


def create_runtime(settings: Settings) -> Runtime:
    found = [ep for ep in entry_points(group=GROUP) if ep.name == settings.runtime]
    if not found:
        raise ValueError(f"unknown runtime {settings.runtime!r}; installed: {', '.join(available()) or 'none'}")
    return found[0].load()(settings)
