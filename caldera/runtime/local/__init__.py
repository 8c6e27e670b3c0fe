"""Local runtime: jobs as processes on this host. ``LocalRuntime`` is imported lazily so that the per-rank
supervisor shim (``python -m caldera.runtime.local.shim``) starts without loading pydantic and friends."""

from __future__ import annotations

from typing import Any

__all__ = ["LocalRuntime"]


def __getattr__(name: str) -> Any:
    if name == "LocalRuntime":
        from caldera.runtime.local.runtime import LocalRuntime

        return LocalRuntime
    raise AttributeError(name)
