"""Node failures in the simulator: when each node goes down and for how long, from a list, or drawn from
exponential times between failures with a fixed seed (so every policy sees the same failures)."""

from __future__ import annotations

import random
from collections.abc import Iterable


class NodeFailures:
    """``failures``: ``(time, node, repair time)`` triples; ``mtbf_s``: each node also fails after exponential
    times of this mean (measured from its last repair), down ``repair_s`` each time."""

    def __init__(
        self,
        nodes: Iterable[str],
        failures: Iterable[tuple[float, str, float]] = (),
        mtbf_s: float | None = None,
        repair_s: float = 3600.0,
        seed: int = 0,
    ) -> None:
        self.nodes = list(nodes)
        known = set(self.nodes)
        self.listed = sorted((float(t), n, float(r)) for t, n, r in failures)
        unknown = sorted({n for _, n, _ in self.listed} - known)
        if unknown:
            raise ValueError(f"node failures name nodes the cluster does not have: {', '.join(unknown[:5])}")
        if mtbf_s is not None and mtbf_s <= 0:
            raise ValueError("node_mtbf_s must be > 0")
        self.mtbf_s = mtbf_s
        self.repair_s = float(repair_s)
        self.rng = random.Random(seed)

    @property
    def any(self) -> bool:
        return bool(self.listed) or self.mtbf_s is not None

    def first(self, start: float) -> list[tuple[float, str, float]]:
        """The listed failures and each node's first drawn one after ``start``."""
        out = list(self.listed)
        if self.mtbf_s is not None:
            out.extend(self._draw(n, start) for n in self.nodes)
        return out

    def after_repair(self, node: str, t: float) -> tuple[float, str, float] | None:
        """The node's next drawn failure after its repair at ``t`` (None without a failure rate)."""
        return None if self.mtbf_s is None else self._draw(node, t)

    def _draw(self, node: str, t: float) -> tuple[float, str, float]:
        assert self.mtbf_s is not None
        return (t + self.rng.expovariate(1.0 / self.mtbf_s), node, self.repair_s)
