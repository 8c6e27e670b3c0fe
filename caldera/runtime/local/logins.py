"""The platform's logins to the session servers of interactive jobs (Jupyter Lab, code-server), each probed on a
thread of its own.

A runtime's ``observe`` runs under the platform's state lock (the scheduling loop holds it while it observes every
job, and every API request that changes jobs waits for it), and a login is a request to a server the job controls,
which may hang or answer without end. So ``observe`` never waits for one: it starts a probe (at most one per attempt
at a time) and reads its result on a later call. Every probe has one deadline for all its I/O (see
``jupyter.UnixConnection``), so its thread ends by then; the proxy, which holds no lock, may wait that long.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable

log = logging.getLogger(__name__)


class Logins:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cookies: dict[Hashable, str] = {}
        self._probing: dict[Hashable, threading.Event] = {}

    def cookie(self, key: Hashable, probe: Callable[[], str | None], wait_s: float = 0.0) -> str | None:
        """The login cookie of ``key``'s server once a probe got it; else starts ``probe`` unless one runs, and waits
        up to ``wait_s`` for it."""
        with self._lock:
            cookie = self._cookies.get(key)
            if cookie is not None:
                return cookie
            done = self._probing.get(key)
            if done is None:
                done = self._probing[key] = threading.Event()
                name = f"login-probe {key}"
                threading.Thread(target=self._probe, args=(key, probe, done), name=name, daemon=True).start()
        if wait_s > 0:
            done.wait(wait_s)
        with self._lock:
            return self._cookies.get(key)

    def known(self, key: Hashable) -> str | None:
        with self._lock:
            return self._cookies.get(key)

    def forget(self, key: Hashable) -> None:
        with self._lock:
            self._cookies.pop(key, None)
            self._probing.pop(key, None)  # a probe still running for it stores nothing (see _probe)

    def _probe(self, key: Hashable, probe: Callable[[], str | None], done: threading.Event) -> None:
        try:
            cookie = probe()
        except Exception:  # noqa: BLE001 - a failed probe is a server not up yet; the next call probes again
            log.exception("login probe failed")
            cookie = None
        with self._lock:
            if self._probing.get(key) is done:
                del self._probing[key]
                if cookie is not None:
                    self._cookies[key] = cookie
        done.set()
