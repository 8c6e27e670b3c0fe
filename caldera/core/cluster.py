"""What a cluster is made of: nodes, their GPUs, and where a job's replica runs.

Runtimes report nodes and receive allocations; the scheduler reads and writes them. Both import these from here so
neither depends on the other.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class Device:
    index: int
    model: str  # lower case, e.g. "a100"
    memory_mib: int = 0


@dataclass(slots=True)
class Node:
    name: str
    cpu: float
    memory_mib: int
    gpus: tuple[Device, ...] = ()
    schedulable: bool = True


@dataclass(slots=True, frozen=True)
class Allocation:
    """Where one replica runs."""

    node: str
    gpus: tuple[int, ...]
    cpu: float
    memory_mib: int
