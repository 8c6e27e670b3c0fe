"""Runtimes run what the scheduler decided. ``base`` is the contract; ``local`` runs jobs as host processes.

Exports are lazy: the local runtime's supervisor shim imports this package and must stay light.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Endpoint", "Handle", "LaunchRequest", "LocalRuntime", "Observation", "Phase", "Runtime"]


def __getattr__(name: str) -> Any:
    if name == "LocalRuntime":
        from caldera.runtime.local.runtime import LocalRuntime

        return LocalRuntime
    if name in __all__:
        from caldera.runtime import base

        return getattr(base, name)
    raise AttributeError(name)
