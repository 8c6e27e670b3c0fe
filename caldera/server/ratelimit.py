"""Failed-login counting: per user name and per client address, over a sliding window.

A name or an address with too many recent failures is refused (429 with Retry-After) before any password is
checked, whether the name exists or not, so the limit tells nothing about which names exist. A successful login
clears its name's count (not its address's: one address guessing many names stays limited). Memory is bounded:
at most ``max_keys`` names and addresses are tracked, the stalest dropped first.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque


class LoginThrottle:
    def __init__(self, per_user: int, per_address: int, window_s: float, max_keys: int = 100_000):
        self.limits = {"user": per_user, "address": per_address}
        self.window_s = window_s
        self.max_keys = max_keys
        self._failures: OrderedDict[tuple[str, str], deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    def _recent(self, key: tuple[str, str], now: float) -> deque[float]:
        times = self._failures.get(key)
        if times is None:
            return deque()
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if not times:
            del self._failures[key]
        return times

    def retry_after(self, username: str, address: str) -> float | None:
        """Seconds until this name and address may try again, or None when they may now."""
        now = time.time()
        waits = []
        with self._lock:
            for kind, value in (("user", username), ("address", address)):
                times = self._recent((kind, value), now)
                if len(times) >= self.limits[kind]:
                    waits.append(times[len(times) - self.limits[kind]] + self.window_s - now)
        return max(waits) if waits else None

    def failed(self, username: str, address: str) -> None:
        now = time.time()
        with self._lock:
            for key in (("user", username), ("address", address)):
                times = self._failures.setdefault(key, deque())
                times.append(now)
                while len(times) > max(self.limits.values()):
                    times.popleft()
                self._failures.move_to_end(key)
            while len(self._failures) > self.max_keys:
                self._failures.popitem(last=False)

    def succeeded(self, username: str) -> None:
        with self._lock:
            self._failures.pop(("user", username), None)
