"""Pod logs copied, while the pods run, into the platform's per-rank log files (the local runtime's run directory
layout, runtime/local/rundir.py), so a job's logs survive the deletion of its pods."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
_CHUNK = 64 * 1024


class LogCopier:
    def __init__(self, core: Any):
        self._core = core
        self._active: set[tuple[str, str]] = set()  # (namespace, pod) being copied now
        self._lock = threading.Lock()

    def ensure(self, namespace: str, pod: str, dest: Path) -> None:
        """Copy the pod's log into ``dest`` in the background unless that is happening already. After a server
        restart the copy starts over from the pod's first byte and skips what ``dest`` already holds."""
        with self._lock:
            if (namespace, pod) in self._active:
                return
            self._active.add((namespace, pod))
        threading.Thread(target=self._copy, args=(namespace, pod, dest), daemon=True, name=f"log-{pod}").start()

    def _copy(self, namespace: str, pod: str, dest: Path) -> None:
        try:
            dest.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            have = dest.stat().st_size if dest.exists() else 0
            resp = self._core.read_namespaced_pod_log(
                pod, namespace, container="job", follow=True, _preload_content=False, _request_timeout=None
            )
            with open(dest, "ab") as out:
                for chunk in resp.stream(_CHUNK):
                    if have:  # already copied before a restart
                        skip = min(have, len(chunk))
                        chunk, have = chunk[skip:], have - skip
                    if chunk:
                        out.write(chunk)
                        out.flush()
        except Exception as e:  # noqa: BLE001 - a pod deleted mid-copy ends its stream one way or another
            log.info("log copy of %s/%s ended: %s", namespace, pod, e)
        finally:
            with self._lock:
                self._active.discard((namespace, pod))
