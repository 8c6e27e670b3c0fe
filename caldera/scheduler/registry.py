"""Policies by name, for the live loop (setting ``policy``) and the simulator (``--policy``)."""
from __future__ import annotations

from typing import Any, Callable

from caldera.scheduler.fifo import FifoPolicy
from caldera.scheduler.snapshot import Policy

POLICIES: dict[str, Callable[..., Policy]] = {
    "fifo": FifoPolicy,
}


def get_policy(name: str, **options: Any) -> Policy:
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(sorted(POLICIES))}") from None
    return factory(**options)
