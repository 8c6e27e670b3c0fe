"""One watch per object type over every Caldera object of the cluster, kept in memory: observe() reads this cache,
so the API server sees one long-lived request per type, not one request per job and poll (README "Kubernetes").

Jobs and pods are found by their Caldera labels; Kueue's Workloads by their owner reference to a Job, and
kube-scheduler's FailedScheduling events by the pod they are about (neither carries Caldera's labels)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from caldera.runtime.kubernetes.manifests import LABEL_ATTEMPT, LABEL_JOB

log = logging.getLogger(__name__)
Key = tuple[str, str]  # (job id, attempt) as label values, or (namespace, name) of what an object is about
KeyFn = Callable[[dict[str, Any]], "Key | None"]


def key_of(obj: dict[str, Any]) -> Key | None:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    if LABEL_JOB not in labels:
        return None
    return labels[LABEL_JOB], labels.get(LABEL_ATTEMPT, "")


def owner_job_of(obj: dict[str, Any]) -> Key | None:
    """(namespace, Job name) of the Job that owns ``obj`` (Kueue's Workload of a batch Job)."""
    meta = obj.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == "Job" and str(ref.get("apiVersion", "")).startswith("batch/"):
            return meta.get("namespace", ""), ref["name"]
    return None


def bound_pod_key(obj: dict[str, Any]) -> Key | None:
    """(node, "") of a pod bound to a node: what holds that node's devices (Caldera's pods or anyone's)."""
    node = (obj.get("spec") or {}).get("nodeName")
    return (node, "") if node else None


def name_key(obj: dict[str, Any]) -> Key:
    """("", name) of a cluster-scoped object (a node, a ClusterQueue)."""
    return "", obj["metadata"]["name"]


def pod_of_event(obj: dict[str, Any]) -> Key | None:
    """(namespace, pod name) an event is about."""
    ref = obj.get("involvedObject") or {}
    return (ref.get("namespace", ""), ref["name"]) if ref.get("kind") == "Pod" and ref.get("name") else None


class WatchCache:
    """Objects of one type by ``key_fn`` (default: (job, attempt) from the labels) and name. ``list_fn`` is a
    client list call over all namespaces (typed, or a custom-object one returning dicts); ``selectors`` its
    label/field selector keywords; ``on_change(kind, obj)`` is called from the watch thread for every event."""

    def __init__(
        self,
        client: Any,
        list_fn: Callable[..., Any],
        timeout_s: int,
        key_fn: KeyFn = key_of,
        selectors: dict[str, str] | None = None,
        on_change: Callable[[str, dict[str, Any]], None] | None = None,
    ):
        self._client = client
        self._list = list_fn
        self._timeout_s = timeout_s
        self._key = key_fn
        self._selectors = {"label_selector": LABEL_JOB} if selectors is None else selectors
        self._on_change = on_change
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

    def by_name(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            for bucket in self._objs.values():
                obj = bucket.get(name)
                if obj is not None and obj["metadata"].get("namespace") == namespace:
                    return obj
        return None

    def all(self) -> list[dict[str, Any]]:
        with self._lock:
            return [obj for bucket in self._objs.values() for obj in bucket.values()]

    def job_keys(self) -> list[Key]:
        with self._lock:
            return list(self._objs)

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                version = self._relist()
                self.synced.set()
                failures = 0
                while not self._stop.is_set():
                    version = self._watch(version)
            except Exception as e:  # noqa: BLE001 - the watch must outlive a broken connection; relist then
                failures += 1  # 1, 2, 4 .. 30 s apart: an API server that is down, or a kind it does not serve
                log.warning("kubernetes watch failed (%d), listing again: %s", failures, str(e)[:300])
                self._stop.wait(min(30.0, 2.0 ** (failures - 1)))

    def _relist(self) -> str:
        self.requests += 1
        listed = self._list(**self._selectors, _request_timeout=self._timeout_s)
        listed = self._client.sanitize_for_serialization(listed)
        fresh: dict[Key, dict[str, dict[str, Any]]] = {}
        for obj in listed.get("items") or []:
            if (k := self._key(obj)) is not None:
                fresh.setdefault(k, {})[obj["metadata"]["name"]] = obj
        with self._lock:
            self._objs = fresh
        if self._on_change is not None:
            for bucket in fresh.values():
                for obj in bucket.values():
                    self._notify("ADDED", obj)
        return str(listed["metadata"]["resourceVersion"])

    def _notify(self, kind: str, obj: dict[str, Any]) -> None:
        try:
            self._on_change(kind, obj)  # type: ignore[misc]
        except Exception:  # noqa: BLE001 - a failing reaction must not end the watch; the next event retries
            log.exception("reacting to a %s event failed", kind)

    def _watch(self, version: str) -> str:
        from kubernetes import watch

        self.requests += 1
        w = watch.Watch()
        for event in w.stream(self._list, **self._selectors, resource_version=version, timeout_seconds=self._timeout_s):
            if self._stop.is_set():
                w.stop()
                break
            if event["type"] == "ERROR":  # 410 Gone: the version is too old, list again
                raise RuntimeError(str(event.get("raw_object")))
            obj = self._client.sanitize_for_serialization(event["object"])
            version = obj["metadata"].get("resourceVersion", version)
            self._apply(event["type"], obj)
            if self._on_change is not None:
                self._notify(event["type"], obj)
        return version

    def _apply(self, kind: str, obj: dict[str, Any]) -> None:
        k = self._key(obj)
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
