"""Run-time estimates learned from each user's finished jobs, as a platform could learn them from its own records.

Traces give no runtime limits, and without one a waiting job can neither backfill in front of a reservation nor
be told when it will start. Users tend to submit similar jobs, so the mean run time of a user's most recent
finished jobs is a usable estimate for the next one (its accuracy is reported with the replay's results).
"""

from __future__ import annotations

from collections import deque


class RuntimeHistory:
    """The last ``window`` run times (seconds) of each user's finished jobs."""

    def __init__(self, window: int = 10) -> None:
        self.window = window
        self._recent: dict[str, deque[float]] = {}

    def add(self, user: str, run_s: float) -> None:
        d = self._recent.get(user)
        if d is None:
            d = self._recent[user] = deque(maxlen=self.window)
        d.append(run_s)

    def estimate(self, user: str) -> float | None:
        """The mean of the user's recent run times; None before the user's first job finishes."""
        d = self._recent.get(user)
        return sum(d) / len(d) if d else None
