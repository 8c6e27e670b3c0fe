"""Pod logs copied, while the pods run, into the platform's per-rank log files (the local runtime's run directory
layout, runtime/local/rundir.py), so a job's logs survive the deletion of its pods."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
_CHUNK = 64 * 1024
_MAX_BACKOFF_S = 60.0
Key = tuple[str, str]  # (namespace, pod)


class LogCopier:
    """One follow request per pod at a time. A copy that ended is started again only after a pause (1 s after a
    clean end, doubling up to a minute after failures), so a pod whose log the kubelet cannot serve costs a
    request a minute, not one per observe(); once a finished pod's log was read to its end, never again."""

    def __init__(self, core: Any):
        self._core = core
        self._active: set[Key] = set()
        self._done: set[Key] = set()
        self._retry: dict[Key, tuple[float, int]] = {}  # not before (monotonic), failures in a row
        self._streams: dict[Key, Any] = {}  # the open follow responses
        self._lock = threading.Lock()

    def ensure(self, namespace: str, pod: str, dest: Path, finished: bool = False) -> None:
        """Copy the pod's log into ``dest`` in the background unless that is happening already (``finished``: the
        pod has ended, so a copy to the end is complete). After a server restart the copy starts over from the
        pod's first byte and skips what ``dest`` already holds."""
        key = (namespace, pod)
        with self._lock:
            if key in self._active or key in self._done or time.monotonic() < self._retry.get(key, (0.0, 0))[0]:
                return
            self._active.add(key)
        threading.Thread(target=self._copy, args=(key, dest, finished), daemon=True, name=f"log-{pod}").start()

    def forget(self, namespace: str, pod: str) -> None:
        """The pod is gone: nothing more to copy or remember of it (a follow still open is closed: a kubelet ends
        it itself, a fake node may not)."""
        with self._lock:
            self._done.discard((namespace, pod))
            self._retry.pop((namespace, pod), None)
            stream = self._streams.pop((namespace, pod), None)
        if stream is not None:
            stream.close()

    def _copy(self, key: Key, dest: Path, finished: bool) -> None:
        namespace, pod = key
        ok = False
        try:
            dest.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            have = dest.stat().st_size if dest.exists() else 0
            resp = self._core.read_namespaced_pod_log(
                pod, namespace, container="job", follow=True, _preload_content=False, _request_timeout=None
            )
            with self._lock:
                self._streams[key] = resp
            with open(dest, "ab") as out:
                for chunk in resp.stream(_CHUNK):
                    if have:  # already copied before a restart
                        skip = min(have, len(chunk))
                        chunk, have = chunk[skip:], have - skip
                    if chunk:
                        out.write(chunk)
                        out.flush()
            ok = True
        except Exception as e:  # noqa: BLE001 - a pod deleted mid-copy ends its stream one way or another
            log.info("log copy of %s/%s ended: %s", namespace, pod, str(e)[:300])
        finally:
            with self._lock:
                self._active.discard(key)
                self._streams.pop(key, None)
                if ok and finished:
                    self._done.add(key)
                else:
                    failures = 0 if ok else self._retry.get(key, (0.0, 0))[1] + 1
                    self._retry[key] = (time.monotonic() + min(_MAX_BACKOFF_S, 2.0**failures), failures)
