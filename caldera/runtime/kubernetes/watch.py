"""One watch per object type over every Caldera object of the cluster, kept in memory: observe() reads this cache,
so the API server sees one long-lived request per type, not one request per job and poll (README "Kubernetes")."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from caldera.runtime.kubernetes.manifests import LABEL_ATTEMPT, LABEL_JOB

log = logging.getLogger(__name__)
Key = tuple[str, str]  # (job id, attempt) as label values


def key_of(obj: dict[str, Any]) -> Key | None:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    if LABEL_JOB not in labels:
        return None
    return labels[LABEL_JOB], labels.get(LABEL_ATTEMPT, "")


class WatchCache:
    """Objects of one type by (job, attempt) and name. ``list_fn`` is a client list call over all namespaces."""

    def __init__(self, client: Any, list_fn: Callable[..., Any], timeout_s: int):
        self._client = client
        self._list = list_fn
        self._timeout_s = timeout_s
        self._objs: dict[Key, dict[str, dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self.synced = threading.Event()
        self.requests = 0  # list and watch calls made, for the benchmark
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="k8s-watch")

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop.set()

    def get(self, key: Key) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._objs.get(key, {}).values())

    def job_keys(self) -> list[Key]:
        with self._lock:
            return list(self._objs)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                version = self._relist()
                self.synced.set()
                while not self._stop.is_set():
                    version = self._watch(version)
            except Exception as e:  # noqa: BLE001 - the watch must outlive a broken connection; relist then
                log.warning("kubernetes watch failed, listing again: %s", e)
                time.sleep(1.0)

    def _relist(self) -> str:
        self.requests += 1
        listed = self._list(label_selector=LABEL_JOB, _request_timeout=self._timeout_s)
        fresh: dict[Key, dict[str, dict[str, Any]]] = {}
        for item in listed.items:
            obj = self._client.sanitize_for_serialization(item)
            if (k := key_of(obj)) is not None:
                fresh.setdefault(k, {})[obj["metadata"]["name"]] = obj
        with self._lock:
            self._objs = fresh
        return str(listed.metadata.resource_version)

    def _watch(self, version: str) -> str:
        from kubernetes import watch

        self.requests += 1
        w = watch.Watch()
        for event in w.stream(
            self._list, label_selector=LABEL_JOB, resource_version=version, timeout_seconds=self._timeout_s
        ):
            if self._stop.is_set():
                w.stop()
                break
            if event["type"] == "ERROR":  # 410 Gone: the version is too old, list again
                raise RuntimeError(str(event.get("raw_object")))
            obj = self._client.sanitize_for_serialization(event["object"])
            version = obj["metadata"].get("resourceVersion", version)
            self._apply(event["type"], obj)
        return version

    def _apply(self, kind: str, obj: dict[str, Any]) -> None:
        k = key_of(obj)
        if k is None:
            return
        name = obj["metadata"]["name"]
        with self._lock:
            bucket = self._objs.setdefault(k, {})
            if kind == "DELETED":
                bucket.pop(name, None)
                if not bucket:
                    del self._objs[k]
            else:
                bucket[name] = obj
