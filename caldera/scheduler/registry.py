"""Policies by name, for the live loop (setting ``policy``) and the simulator (``--policy``).

* ``fifo``: first in, first out with exclusive gangs and head-of-line blocking (a default Volcano queue);
* ``tiresias``: discretised 2D least-attained-service, preemptive, no quotas;
* ``caldera``: quotas (guarantee, deserved, capability), user caps, priority classes, fair share with decay,
  reservations against starvation with backfill, preemption and reclaim, and a reason for every waiting job.

Each factory takes keyword options with defaults (see the classes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from caldera.scheduler.caldera_policy import CalderaPolicy
from caldera.scheduler.fifo import FifoPolicy
from caldera.scheduler.snapshot import Policy
from caldera.scheduler.tiresias import TiresiasPolicy

POLICIES: dict[str, Callable[..., Policy]] = {
    "fifo": FifoPolicy,
    "tiresias": TiresiasPolicy,
    "caldera": CalderaPolicy,
}


def get_policy(name: str, **options: Any) -> Policy:
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(sorted(POLICIES))}") from None
    return factory(**options)
