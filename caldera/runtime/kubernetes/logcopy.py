"""Pod logs copied, while the pods run, into the platform's per-rank log files (the local runtime's run directory
layout, runtime/local/rundir.py), so a job's logs survive the deletion of its pods."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
_CHUNK = 64 * 1024
_ENDED = ("Succeeded", "Failed")
Key = tuple[str, str]  # (namespace, pod)


@dataclass
class _Copy:
    dest: Path
    phase: str  # the pod's, as the pod watch last saw it
    wake: threading.Event = field(default_factory=threading.Event)  # the pod changed or went
    gone: bool = False
    stream: Any = None  # the open follow response
    thread: threading.Thread | None = None


class LogCopier:
    """One thread per pod, following its log into its file for as long as the pod runs. A follow that fails or
    ends while the pod still runs (the log not servable yet, the kubelet restarted, a broken connection) is made
    again after a pause: ``backoff_s`` after a clean end, doubling up to ``max_backoff_s`` after failures in a row,
    and at once when the pod changes (ends), so a pod whose log cannot be served costs a request per
    ``max_backoff_s``, not one per observe(). The thread ends once a finished pod's log was read to its end (or
    failed ``finished_tries`` times in a row), or the pod is gone: ``forget``, or ``exists`` says so after a
    failure (a pod deleted while the watch was relisting has no DELETED event). Each follow reads the log from the
    pod's first byte and skips what the file holds already, so nothing is copied twice, also after a restart."""

    def __init__(
        self,
        core: Any,
        exists: Callable[[str, str], bool] = lambda namespace, pod: True,
        backoff_s: float = 1.0,
        max_backoff_s: float = 60.0,
        finished_tries: int = 5,
    ):
        self._core, self._exists = core, exists
        self._backoff_s, self._max_backoff_s, self._finished_tries = backoff_s, max_backoff_s, finished_tries
        self._copies: dict[Key, _Copy] = {}
        self._done: set[Key] = set()  # finished pods whose whole log is copied
        self._lock = threading.Lock()

    def ensure(self, namespace: str, pod: str, dest: Path, phase: str) -> None:
        """Copy the pod's log into ``dest`` in the background unless that is happening (or done) already."""
        key = (namespace, pod)
        with self._lock:
            if key in self._done or key in self._copies:
                return
            self._copies[key] = copy = _Copy(dest, phase)
            copy.thread = threading.Thread(target=self._run, args=(key, copy), daemon=True, name=f"log-{pod}")
            copy.thread.start()

    def pod_changed(self, namespace: str, pod: str, phase: str) -> None:
        """From the pod watch: a copy waiting to follow again does so now that the pod has changed."""
        with self._lock:
            copy = self._copies.get((namespace, pod))
        if copy is not None and copy.phase != phase:
            copy.phase = phase
            copy.wake.set()

    def forget(self, namespace: str, pod: str) -> _Copy | None:
        """The pod is gone: nothing more to copy or remember of it (a follow still open is closed: a kubelet ends
        it itself, a fake node may not). Returns its copy, if one was running."""
        with self._lock:
            self._done.discard((namespace, pod))
            copy = self._copies.pop((namespace, pod), None)
        if copy is not None:
            copy.gone = True
            copy.wake.set()
            if copy.stream is not None:
                copy.stream.close()
        return copy

    def close(self, wait_s: float = 5.0) -> None:
        """Stop every copy and wait for its thread (the runtime is closing): a thread left inside a TLS read when
        the interpreter exits can crash it."""
        with self._lock:
            keys = list(self._copies)
        copies = [c for c in (self.forget(*key) for key in keys) if c is not None]
        for copy in copies:
            if copy.thread is not None:
                copy.thread.join(wait_s)

    def _run(self, key: Key, copy: _Copy) -> None:
        failures, complete = 0, False
        while not copy.gone:
            copy.wake.clear()
            finished = copy.phase in _ENDED  # seen before the request: a follow made after the end reads it all
            ok = self._follow(key, copy)
            if ok and finished:
                complete = True
                break
            failures = 0 if ok else failures + 1
            if not ok and not self._exists(*key):
                break
            if finished and failures >= self._finished_tries:
                log.warning("log of finished pod %s/%s not readable; %d tries", *key, failures)
                break
            copy.wake.wait(min(self._max_backoff_s, self._backoff_s * 2.0**failures))
        with self._lock:
            if self._copies.get(key) is copy:
                del self._copies[key]
                if complete:
                    self._done.add(key)

    def _follow(self, key: Key, copy: _Copy) -> bool:
        """One follow request to its end; False if it failed."""
        namespace, pod = key
        try:
            copy.dest.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            have = copy.dest.stat().st_size if copy.dest.exists() else 0
            copy.stream = self._core.read_namespaced_pod_log(
                pod, namespace, container="job", follow=True, _preload_content=False, _request_timeout=None
            )
            with open(copy.dest, "ab") as out:
                for chunk in copy.stream.stream(_CHUNK):
                    skip = min(have, len(chunk))  # copied by an earlier follow
                    chunk, have = chunk[skip:], have - skip
                    if chunk:
                        out.write(chunk)
                        out.flush()
            return True
        except Exception as e:  # noqa: BLE001 - not servable yet, a broken connection, a pod deleted mid-copy
            log.info("log copy of %s/%s ended: %s", namespace, pod, str(e)[:300])
            return False
        finally:
            copy.stream = None
