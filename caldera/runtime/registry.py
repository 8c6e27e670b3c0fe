"""Runtimes by name (setting ``runtime``), registered as entry points in the ``caldera.runtimes`` group, the way
JupyterHub finds spawners: a site's own backend is a package that declares one, nothing here changes.

A runtime is a class taking the platform's Settings; it imports its own client libraries lazily.
"""

from __future__ import annotations

from importlib.metadata import entry_points

from caldera.config import Settings
from caldera.runtime.base import LaunchError, Runtime
from caldera.runtime.default import resolved

GROUP = "caldera.runtimes"


def available() -> list[str]:
    return sorted(ep.name for ep in entry_points(group=GROUP))


def create_runtime(settings: Settings) -> Runtime:
    """The runtime of that name; ``LaunchError("RuntimeUnavailable")`` when none is installed by that name or it
    cannot start here (its client library missing, its cluster unreachable)."""
    settings = resolved(settings)
    found = [ep for ep in entry_points(group=GROUP) if ep.name == settings.runtime]
    if not found:
        raise LaunchError(
            "RuntimeUnavailable",
            f"unknown runtime {settings.runtime!r}; installed: {', '.join(available()) or 'none'}",
        )
    try:
        return found[0].load()(settings)
    except LaunchError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever a backend's start-up raises, the caller needs one type
        raise LaunchError("RuntimeUnavailable", f"runtime {settings.runtime!r} cannot start here: {exc}") from exc


def launched_by(handle: dict) -> str | None:
    """Which built-in runtime a stored handle belongs to, by its shape: for attempts recorded before the platform
    kept each attempt's runtime (``Job.runtime``). None when it cannot tell (no handle yet)."""
    if "names" in handle:
        return "container"
    if "namespace" in handle:
        return "kubernetes"
    if "ranks" in handle:
        return "local"
    return None
