"""The Kubernetes backend: each job is a suspended batch/v1 Job that Kueue admits and kube-scheduler places.

``admits_jobs``: the platform's loop does no placement for this runtime; it hands a queued job over at once and
shows the cluster's own reasons while it waits (see caldera/server/loop.py). The official ``kubernetes`` client is
imported only when this runtime is created.
"""

from __future__ import annotations

import base64
import json
import logging
import secrets
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

from caldera.config import Settings
from caldera.core.cluster import Device, Node
from caldera.core.resources import CPU, GPU, MEMORY
from caldera.core.spec import JobKind
from caldera.core.tenancy import QueueConfig
from caldera.runtime.base import (
    OTHER_HOLDER,
    Endpoint,
    ExecError,
    Handle,
    LaunchError,
    LaunchRequest,
    Observation,
    Phase,
)
from caldera.runtime.exec_process import ExecProcess
from caldera.runtime.kubernetes import evictions, kueue
from caldera.runtime.kubernetes import exec as pod_exec
from caldera.runtime.kubernetes import manifests as m
from caldera.runtime.kubernetes.logcopy import LogCopier
from caldera.runtime.kubernetes.settings import KubernetesSettings
from caldera.runtime.kubernetes.status import EVICTED_ANNOTATION, STOPPED_ANNOTATION, pending_reasons, phase_of
from caldera.runtime.kubernetes.volumes import SharedRoots
from caldera.runtime.kubernetes.watch import WatchCache, bound_pod_key, name_key, owner_job_of, pod_of_event
from caldera.runtime.local import code_server
from caldera.runtime.local.log_follow import follow_file
from caldera.runtime.local.rundir import RunDir

_ENDED = (Phase.SUCCEEDED, Phase.FAILED, Phase.LOST)
PODS_READY_TIMEOUT = "PodsReadyTimeout"  # Kueue's eviction reason: not every pod ready in time (no node fits)
_ENDED_KEPT = 10_000  # ended attempts remembered (their Jobs are deleted ttlSecondsAfterFinished after the end)
log = logging.getLogger(__name__)


def _client(ks: KubernetesSettings) -> Any:
    try:
        import kubernetes
    except ImportError as e:
        raise LaunchError("RuntimeUnavailable", "pip install 'caldera[kubernetes]' for the kubernetes runtime") from e
    if ks.kubeconfig is not None:
        return kubernetes.config.new_client_from_config(config_file=str(ks.kubeconfig), context=ks.context)
    kubernetes.config.load_incluster_config()
    return kubernetes.client.ApiClient()


class KubernetesRuntime:
    name = "kubernetes"
    admits_jobs = True  # Kueue admits, kube-scheduler places

    def __init__(self, settings: Settings, ks: KubernetesSettings | None = None):
        self.settings = settings
        self.ks = ks or KubernetesSettings()
        self.api = _client(self.ks)
        from kubernetes import client

        self.core = client.CoreV1Api(self.api)
        self.batch = client.BatchV1Api(self.api)
        self.net = client.NetworkingV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        timeout = self.ks.watch_timeout_s
        self.jobs = WatchCache(self.api, self.batch.list_job_for_all_namespaces, timeout)
        self.pods = WatchCache(self.api, self.core.list_pod_for_all_namespaces, timeout, on_change=self._pod_changed)
        # Kueue's Workloads by the Job that owns them (the reasons it gives, its preemptions) and kube-scheduler's
        # FailedScheduling events by pod: one watch each, like Jobs and pods
        group, version = kueue.API_VERSION.split("/")
        list_workloads = partial(self.custom.list_cluster_custom_object, group, version, "workloads")
        self.workloads = WatchCache(
            self.api, list_workloads, timeout, key_fn=owner_job_of, selectors={}, on_change=self._workload_changed
        )
        self.events = WatchCache(
            self.api,
            self.core.list_event_for_all_namespaces,
            timeout,
            key_fn=pod_of_event,
            selectors={"field_selector": "involvedObject.kind=Pod,reason=FailedScheduling"},
        )
        # the nodes, for what of them decides where pods fit: a job held because none fit waits for a change
        self.node_objs = WatchCache(self.api, self.core.list_node, timeout, key_fn=name_key, selectors={})
        # Kueue's ClusterQueues, for the quota and use of a queue's GPU total when a job waits for it
        list_cluster_queues = partial(self.custom.list_cluster_custom_object, group, version, "clusterqueues")
        self.cluster_queues = WatchCache(self.api, list_cluster_queues, timeout, key_fn=name_key, selectors={})
        # every pod bound to a node that has not ended, Caldera's or not: who holds which node's GPUs (nodes page)
        self.bound_pods = WatchCache(
            self.api,
            self.core.list_pod_for_all_namespaces,
            timeout,
            key_fn=bound_pod_key,
            selectors={"field_selector": "status.phase!=Succeeded,status.phase!=Failed"},
        )
        self.copier = LogCopier(self.core, exists=lambda ns, pod: self.pods.by_name(ns, pod) is not None)
        self._stopped: set[tuple[str, int]] = set()
        self._namespaces: set[str] = set()
        self._lab_tokens: dict[tuple[str, str], str] = {}  # (namespace, Secret): a running lab's token
        self._warned_gpu_total = False
        # attempts seen ended, newest last: observe() still answers once the Job is gone (deleted after it ended)
        self._ended: dict[tuple[str, str], Observation] = {}
        self._lock = threading.Lock()
        # job id -> its evictions in a row for pods not ready in time (evictions.py), for its next attempt
        self._evictions: dict[str, dict[str, Any]] = {}
        self._unschedulable: dict[tuple[str, str], str] = {}  # (job, attempt): kube-scheduler's last word
        self.caches = (
            self.jobs,
            self.pods,
            self.workloads,
            self.events,
            self.node_objs,
            self.bound_pods,
            self.cluster_queues,
        )
        for cache in self.caches:
            cache.start()

    def close(self) -> None:
        for cache in self.caches:
            cache.close()
        self.copier.close()

    # -- launch -------------------------------------------------------------------------------------------------
    def launch(self, req: LaunchRequest) -> Handle:
        ns = m.namespace(self.ks, m.account_of(req))
        self._ensure_namespace(ns)
        data: dict[str, Any] = {
            "namespace": ns,
            "name": m.job_name(req.job_id, req.attempt),
            "kind": req.spec.kind.value,
            "replicas": req.spec.replicas if req.spec.kind is JobKind.DISTRIBUTED else 1,
            "per_replica": req.spec.procs_per_replica if req.spec.kind is JobKind.DISTRIBUTED else 1,
        }
        lab_secret = None
        objs = []
        if req.spec.kind.interactive:
            secret = m.lab_token_secret(req, self.ks, secrets.token_hex(24))
            lab_secret = secret["metadata"]["name"]
            objs.append(secret)
            data.update(secret=lab_secret, base_url=_home_of(req.spec.kind, req.base_url))
        grace_s = int(self.settings.preempt_grace_s)
        objs += m.build(req, self.ks, lab_secret, grace_s, roots=SharedRoots.of(self.settings))
        *parts, job = objs
        held = self._held_back(req)
        if held is not None:  # in its real queue once the backoff is over, or the nodes changed (observe)
            job["metadata"]["labels"][m.KUEUE_QUEUE] = evictions.HELD_QUEUE
            job["metadata"]["annotations"][evictions.EVICTIONS_ANNOTATION] = json.dumps(held)
        try:
            for obj in parts:
                self._create(obj)
            created = self.api.sanitize_for_serialization(self._create(job))
        except LaunchError:
            # a Job that exists already (AlreadyRunning) owns these; else nothing would ever delete them
            for obj in parts if not self._job_exists(job) else []:
                self._delete(obj)
            raise
        owned = {"metadata": {"ownerReferences": [m.owner_reference(created)]}}
        for obj in parts:  # the garbage collector deletes them with the Job
            self._call(self._api_of(obj, "patch"), obj["metadata"]["name"], obj["metadata"]["namespace"], owned)
        self._run_dir(req.job_id, req.attempt).mkdir(parents=True, exist_ok=True, mode=0o700)
        return Handle(req.job_id, req.attempt, data)

    def _held_back(self, req: LaunchRequest) -> dict[str, Any] | None:
        with self._lock:
            history = self._evictions.get(req.job_id)
        if history is None or history["attempt"] >= req.attempt:
            return None
        nodes = self._nodes_fingerprint()
        return evictions.hold_back(
            history, self.ks.eviction_backoff_s, self.ks.evictions_before_hold, nodes, time.time()
        )

    def _nodes_fingerprint(self) -> str:
        self.node_objs.synced.wait(self.ks.request_timeout_s)
        return evictions.fingerprint(self.node_objs.all())

    def _api_of(self, obj: dict[str, Any], verb: str) -> Any:
        """The typed client call ``verb`` (create, patch, delete) for the kind of ``obj``."""
        api, kind = {
            "Job": (self.batch, "job"),
            "Service": (self.core, "service"),
            "Secret": (self.core, "secret"),
            "NetworkPolicy": (self.net, "network_policy"),
        }[obj["kind"]]
        return getattr(api, f"{verb}_namespaced_{kind}")

    def _job_exists(self, job: dict[str, Any]) -> bool:
        try:
            self._call(self.batch.read_namespaced_job, job["metadata"]["name"], job["metadata"]["namespace"])
        except LaunchError:
            return False
        return True

    def _delete(self, obj: dict[str, Any]) -> None:
        try:
            self._quiet(self._api_of(obj, "delete"), obj["metadata"]["name"], obj["metadata"]["namespace"])
        except Exception as e:  # noqa: BLE001 - the launch's own error is the one to report
            log.warning("could not delete %s %s: %s", obj["kind"], obj["metadata"]["name"], e)

    def _ensure_namespace(self, ns: str) -> None:
        if ns in self._namespaces:
            return
        body = {"metadata": {"name": ns, "labels": {"caldera.io/managed": "true"}}}
        self._call(self.core.create_namespace, body, exists_ok=True)
        self._namespaces.add(ns)

    def _create(self, obj: dict[str, Any]) -> Any:
        create = self._api_of(obj, "create")
        return self._call(create, obj["metadata"]["namespace"], obj, exists_ok=obj["kind"] != "Job")

    def _call(self, fn: Any, *args: Any, exists_ok: bool = False) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            return fn(*args, _request_timeout=self.ks.request_timeout_s)
        except ApiException as e:
            if e.status == 409 and exists_ok:
                return None
            reason = {409: "AlreadyRunning", 403: "Forbidden", 422: "Invalid"}.get(e.status or 0, "RuntimeUnavailable")
            raise LaunchError(reason, f"kubernetes: {e.status} {e.reason}: {(e.body or '')[:500]}") from e
        except Exception as e:  # connection refused, timeouts
            raise LaunchError("RuntimeUnavailable", f"kubernetes API unreachable: {e}") from e

    # -- observe ------------------------------------------------------------------------------------------------
    def observe(self, handle: Handle) -> Observation:
        self.jobs.synced.wait(self.ks.request_timeout_s)
        self.pods.synced.wait(self.ks.request_timeout_s)
        key = (m.label_value(handle.job_id), str(handle.attempt))
        jobs, pods = self.jobs.get(key), self.pods.get(key)
        job = jobs[0] if jobs else None
        if job is None and (ended := self._ended.get(key)) is not None:
            return ended  # its Job went after it ended (ttlSecondsAfterFinished, or an eviction's deletion)
        workload = self._workload_of(job)
        eviction = kueue.eviction(workload) if workload is not None else None
        obs = phase_of(job, pods, int(handle.data.get("replicas", 1)), self._was_stopped(handle), eviction)
        self._copy_logs(handle, pods)
        if job is not None and obs.phase in _ENDED:
            self._remember_ended(key, obs)
        if job is not None:
            self._follow_evictions(handle, job, obs, eviction)
        if obs.reason in ("Preempted", "Evicted"):  # this attempt is over; its Job goes, the platform requeues
            ns, name = jobs[0]["metadata"]["namespace"], jobs[0]["metadata"]["name"]
            self._quiet(self.batch.delete_namespaced_job, name, ns, propagation_policy="Background")
        return obs

    def _follow_evictions(
        self, handle: Handle, job: dict[str, Any], obs: Observation, eviction: tuple[str, str] | None
    ) -> None:
        """Count an eviction for pods not ready in time, forget the count once the job ran, and hand a held-back
        Job to Kueue when its time came (see evictions.py)."""
        history = evictions.carried(job)
        labels = job["metadata"].get("labels") or {}
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
        marked = json.loads((job["metadata"].get("annotations") or {}).get(EVICTED_ANNOTATION) or "{}")
        key, unschedulable = (m.label_value(handle.job_id), str(handle.attempt)), ""
        if obs.phase is not Phase.STARTING:
            with self._lock:  # kube-scheduler's last word matters only while the attempt waits, and for its eviction
                unschedulable = self._unschedulable.pop(key, "")
        if obs.reason == "Evicted" and (marked.get("reason") or (eviction or ("",))[0]) == PODS_READY_TIMEOUT:
            after = evictions.after_eviction(job, marked.get("unschedulable") or unschedulable or obs.message)
            after["nodes"] = self._nodes_fingerprint()  # a change of them from here on ends the wait
            with self._lock:
                self._evictions[handle.job_id] = {**after, "attempt": handle.attempt}
        elif obs.phase is Phase.RUNNING and history.get("count"):
            with self._lock:
                self._evictions.pop(handle.job_id, None)
            note = {"metadata": {"annotations": {evictions.EVICTIONS_ANNOTATION: json.dumps({"count": 0})}}}
            self._quiet(self.batch.patch_namespaced_job, name, ns, note)
        elif obs.phase is Phase.STARTING and labels.get(m.KUEUE_QUEUE) == evictions.HELD_QUEUE:
            self._release_if_due(job, history)

    def _release_if_due(self, job: dict[str, Any], history: dict[str, Any]) -> None:
        """A held-back Job goes into its real queue once due; the count starts again if the nodes changed."""
        nodes = self._nodes_fingerprint()
        if not evictions.due(history, nodes):
            return
        changed = history.get("nodes", nodes) != nodes
        kept = json.dumps({"count": 0 if changed else history.get("count", 0), "message": history.get("message", "")})
        meta = job["metadata"]
        patch = {"metadata": {"labels": {m.KUEUE_QUEUE: meta["labels"].get(m.LABEL_QUEUE, "default")}}}
        patch["metadata"]["annotations"] = {evictions.EVICTIONS_ANNOTATION: kept}
        self._quiet(self.batch.patch_namespaced_job, meta["name"], meta["namespace"], patch)
        why = "the nodes changed" if changed else "its backoff"
        log.info("job %s/%s handed to Kueue again after %s", meta["namespace"], meta["name"], why)

    def _remember_ended(self, key: tuple[str, str], obs: Observation) -> None:
        with self._lock:
            self._ended[key] = obs
            while len(self._ended) > _ENDED_KEPT:
                self._ended.pop(next(iter(self._ended)))

    def why_pending(self, handle: Handle) -> list[dict[str, Any]]:
        """The cluster's reasons a started job has no running pods yet, from the watch caches (no API call): Kueue's
        (the Workload of the job's Job) and kube-scheduler's (FailedScheduling events of its pods)."""
        key = (m.label_value(handle.job_id), str(handle.attempt))
        jobs, pods = self.jobs.get(key), self.pods.get(key)
        job = jobs[0] if jobs else None
        history = evictions.carried(job)
        if job is not None and (job["metadata"].get("labels") or {}).get(m.KUEUE_QUEUE) == evictions.HELD_QUEUE:
            return [evictions.reason(history)]  # held back: Kueue's word is only that its queue does not exist
        workload = self._workload_of(job)
        events = {}
        for pod in pods:
            meta = pod["metadata"]
            found = self.events.get((meta["namespace"], meta["name"]))
            if found:
                events[meta["name"]] = max(found, key=_event_time)
        reasons = pending_reasons(job, pods, workload, events, self._cluster_queue_of(job))
        unschedulable = [r["message"] for r in reasons if r["code"] == "Unschedulable"]
        if unschedulable:  # kept for the eviction that may follow (the pods are gone by then)
            with self._lock:
                self._unschedulable[key] = unschedulable[0]
        return reasons

    def _workload_of(self, job: dict[str, Any] | None) -> dict[str, Any] | None:
        """Kueue's Workload of the Job (found by its owner reference), the newest if Kueue made several."""
        if job is None:
            return None
        found = self.workloads.get((job["metadata"]["namespace"], job["metadata"]["name"]))
        return max(found, key=lambda w: w["metadata"].get("creationTimestamp") or "") if found else None

    def _cluster_queue_of(self, job: dict[str, Any] | None) -> dict[str, Any] | None:
        """The ClusterQueue Caldera made for the Job's queue (None when Kueue's queues are the site's own)."""
        queue = ((job or {}).get("metadata", {}).get("labels") or {}).get(m.LABEL_QUEUE)
        found = self.cluster_queues.get(("", kueue.cluster_queue_name(queue))) if queue else []
        return found[0] if found else None

    def _was_stopped(self, handle: Handle) -> bool:
        return (handle.job_id, handle.attempt) in self._stopped or bool(handle.data.get("stopped"))

    def _copy_logs(self, handle: Handle, pods: list[dict[str, Any]]) -> None:
        rd = RunDir(self._run_dir(handle.job_id, handle.attempt))
        for pod in pods:
            status = pod.get("status") or {}
            if status.get("phase") not in ("Running", "Succeeded", "Failed"):
                continue
            index = _completion_index(pod)
            self.copier.ensure(pod["metadata"]["namespace"], pod["metadata"]["name"], rd.log(index), status["phase"])

    def _run_dir(self, job_id: str, attempt: int) -> Path:
        return Path(self.settings.runs_dir).resolve() / job_id / str(attempt)

    def _pod_changed(self, kind: str, pod: dict[str, Any]) -> None:
        ns, name = pod["metadata"].get("namespace", ""), pod["metadata"]["name"]
        if kind != "DELETED":
            self.copier.pod_changed(ns, name, (pod.get("status") or {}).get("phase", ""))
            return
        self.copier.forget(ns, name)
        job = (pod["metadata"].get("labels") or {}).get("batch.kubernetes.io/job-name", "")
        with self._lock:
            self._lab_tokens.pop((ns, m.lab_secret_name(job)), None)

    # -- eviction by Kueue --------------------------------------------------------------------------------------
    def _workload_changed(self, kind: str, workload: dict[str, Any]) -> None:
        """Kueue evicted a Caldera job: preempted it (to reclaim quota lent within the cohort, or for a higher
        priority), or not all its pods were ready in time. Kueue suspends the Job and its pods get SIGTERM with
        terminationGracePeriodSeconds (the platform's preemption grace) as their grace. Here a preempted job's
        pods get the notice at once (the preStop hook waits for it), the Workload is deactivated so Kueue does not
        start this attempt again, and the Job is marked, which observe() reports once the pods are gone; the
        platform then requeues the job as a new attempt (so a Job the suspension failed does not matter)."""
        if kueue.counts_gpu_total(workload) is False and not self._warned_gpu_total:
            self._warned_gpu_total = True
            log.warning(
                "Kueue admits GPUs without counting %s: model-less GPU quotas are not totals; add %s to Kueue's "
                "Configuration (resources.transformations)",
                kueue.GPU_TOTAL_RESOURCE,
                kueue.GPU_TOTAL_TRANSFORMATION,
            )
        evicted = kueue.eviction(workload) if kind != "DELETED" else None
        owner = owner_job_of(workload)
        if evicted is None or owner is None:
            return
        job = self.jobs.by_name(*owner)
        if job is None or EVICTED_ANNOTATION in (job["metadata"].get("annotations") or {}):
            return  # not Caldera's, or seen already
        reason, message = evicted
        ns, name = owner
        key = (job["metadata"]["labels"][m.LABEL_JOB], job["metadata"]["labels"].get(m.LABEL_ATTEMPT, ""))
        if reason == kueue.EVICTED_BY_PREEMPTION:
            grace = int(job["spec"]["template"]["spec"].get("terminationGracePeriodSeconds") or 30)
            self._give_notice(ns, self.pods.get(key), f"preempted by Kueue: {message}", time.time() + grace)
        group, version = kueue.API_VERSION.split("/")
        wl_name = workload["metadata"]["name"]
        inactive = {"spec": {"active": False}}
        self._quiet(self.custom.patch_namespaced_custom_object, group, version, ns, "workloads", wl_name, inactive)
        with self._lock:
            unschedulable = self._unschedulable.get(key, "")
        pods = self.pods.get(key)
        now_unschedulable = [r["message"] for r in pending_reasons(None, pods) if r["code"] == "Unschedulable"]
        unschedulable = now_unschedulable[0] if now_unschedulable else unschedulable
        marked = {
            EVICTED_ANNOTATION: json.dumps({"reason": reason, "message": message, "unschedulable": unschedulable})
        }
        self._quiet(self.batch.patch_namespaced_job, name, ns, {"metadata": {"annotations": marked}})
        log.info("job %s/%s evicted by Kueue (%s): %s", ns, name, reason, message)

    def _give_notice(self, ns: str, pods: list[dict[str, Any]], notice: str, kill_at: float) -> None:
        """The notice into each pod's notice annotation, which its downward-API volume shows the job as the
        CALDERA_PREEMPT_NOTICE file; the deadline is the pod's own when it is being deleted already."""
        for pod in pods:
            text = notice if notice.endswith("\n") else notice + "\n"
            if "deadline:" not in text:
                deadline = pod["metadata"].get("deletionTimestamp") or _iso(kill_at)
                text += f"deadline: {deadline}\n"
            patch = {"metadata": {"annotations": {m.NOTICE_ANNOTATION: text}}}
            self._quiet(self.core.patch_namespaced_pod, pod["metadata"]["name"], ns, patch)

    # -- stop ---------------------------------------------------------------------------------------------------
    def stop(self, handle: Handle, grace_s: float, notice: str | None = None) -> None:
        """The notice goes into every pod's notice annotation (the job reads it as the CALDERA_PREEMPT_NOTICE file,
        and its preStop hook waits for it), then the pods are deleted with ``grace_s`` as their grace period."""
        with self._lock:
            self._stopped.add((handle.job_id, handle.attempt))
        handle.data["stopped"] = True
        try:
            ns, name = self._where(handle)
        except LookupError:
            return  # nothing of it in the cluster: nothing to stop
        kill_at = time.time() + max(0.0, grace_s)
        stamp = {"metadata": {"annotations": {STOPPED_ANNOTATION: str(kill_at)}}}
        self._quiet(self.batch.patch_namespaced_job, name, ns, stamp)
        key = (m.label_value(handle.job_id), str(handle.attempt))
        pods = self.pods.get(key)
        if notice is not None:
            self._give_notice(ns, pods, notice, kill_at)
        for pod in pods:
            self._quiet(self.core.delete_namespaced_pod, pod["metadata"]["name"], ns, grace_period_seconds=int(grace_s))
        if not pods:  # not admitted yet: nothing runs, the Job goes
            self._quiet(self.batch.delete_namespaced_job, name, ns, propagation_policy="Background")

    def _where(self, handle: Handle) -> tuple[str, str]:
        """Namespace and name of the job's objects; from the cluster by label when the handle has none (the server
        stopped while the launch was in flight)."""
        if "namespace" in handle.data:
            return handle.data["namespace"], handle.data["name"]
        found = [h for h in self.attached() if (h.job_id, h.attempt) == (handle.job_id, handle.attempt)]
        if not found:
            raise LookupError(f"no Kubernetes Job of {handle.job_id} attempt {handle.attempt}")
        handle.data.update(found[0].data)
        return handle.data["namespace"], handle.data["name"]

    def _quiet(self, fn: Any, *args: Any, **kwargs: Any) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            fn(*args, _request_timeout=self.ks.request_timeout_s, **kwargs)
        except ApiException as e:
            if e.status != 404:  # gone already is what stop wants
                raise

    # -- logs ---------------------------------------------------------------------------------------------------
    def logs(self, handle: Handle, rank: int | None = None, follow: bool = False, offset: int = 0) -> Iterator[bytes]:
        replicas, per = _shape(handle)
        r = 0 if rank is None else rank
        if not 0 <= r < replicas * per:
            raise ValueError(f"rank {r} does not exist (world size {replicas * per})")
        path = RunDir(self._run_dir(handle.job_id, handle.attempt)).log(r // per)  # ranks of one pod share its log
        return self._follow(handle, path, follow, max(0, offset))

    def _follow(self, handle: Handle, path: Path, follow: bool, offset: int) -> Iterator[bytes]:
        ended = lambda: self.observe(handle).phase in _ENDED  # noqa: E731
        while not path.exists():  # the copier has not started on this pod yet
            if not follow or ended():
                return
            time.sleep(0.2)
        yield from follow_file(path, offset, follow, ended, settle_s=0.5)  # the copier's last bytes

    # -- endpoints ----------------------------------------------------------------------------------------------
    def exec(self, handle: Handle, rank: int, argv: list[str], tty: bool, term: str = "") -> ExecProcess:
        """``argv`` in the pod of rank ``rank`` (the ranks of one replica share its pod) through the pods' exec
        API, as the pod's user, the job's uid; only a running job's running pod (see ``exec.start``)."""
        if self.observe(handle).phase is not Phase.RUNNING:
            raise ExecError("NotRunning", f"job {handle.job_id} is not running")
        replicas, per = _shape(handle)
        if not 0 <= rank < replicas * per:
            raise ExecError("NoSuchRank", f"rank {rank} does not exist (world size {replicas * per})")
        pods = self.pods.get((m.label_value(handle.job_id), str(handle.attempt)))
        pod = next((p for p in pods if _completion_index(p) == rank // per), None)
        meta = pod["metadata"] if pod else {}
        if pod is None or (pod.get("status") or {}).get("phase") != "Running" or meta.get("deletionTimestamp"):
            raise ExecError("NotRunning", f"rank {rank} of job {handle.job_id} is not running")
        return pod_exec.start(self.core, meta["namespace"], meta["name"], argv, tty, term, self.ks.request_timeout_s)

    def endpoints(self, handle: Handle) -> list[Endpoint]:
        """The lab of a running jupyter or vscode job at its pod's IP (from the pod watch), logged in with the token
        (Lab's header, code-server's session cookie). The pod IP, not a Service's ClusterIP: it needs no kube-proxy
        on the platform's side, nor a request per proxied call."""
        kind = handle.data.get("kind")
        if kind not in (JobKind.JUPYTER.value, JobKind.VSCODE.value) or self.observe(handle).phase is not Phase.RUNNING:
            return []
        pods = self.pods.get((m.label_value(handle.job_id), str(handle.attempt)))
        ip = next((p["status"]["podIP"] for p in pods if (p.get("status") or {}).get("podIP")), None)
        if ip is None:
            return []
        token = self._lab_token(self._where(handle)[0], handle.data["secret"])
        base_url = handle.data.get("base_url", "/")
        if kind == JobKind.VSCODE.value:
            login = {"Cookie": f"{code_server.SESSION_COOKIE}={token}"}
        else:
            login = {"Authorization": f"token {token}"}
        return [
            Endpoint(
                name="lab",
                host=ip,
                port=self.ks.lab_port,
                base_url=base_url if base_url.endswith("/") else base_url + "/",
                headers=login,
                secrets=(token,),
            )
        ]

    def _lab_token(self, ns: str, secret: str) -> str:
        """The lab's token from its Secret, read once per job attempt (forgotten with its pod)."""
        with self._lock:
            token = self._lab_tokens.get((ns, secret))
        if token is None:
            read = self.core.read_namespaced_secret(secret, ns, _request_timeout=self.ks.request_timeout_s)
            token = base64.b64decode(read.data[m.LAB_TOKEN_KEY]).decode()
            with self._lock:
                self._lab_tokens[(ns, secret)] = token
        return token

    # -- queues -------------------------------------------------------------------------------------------------
    def apply_queues(self, queues: list[QueueConfig]) -> None:
        """Caldera's queues as Kueue's (a ResourceFlavor per GPU model the cluster has, a ClusterQueue and a
        LocalQueue per queue, the cohorts); managed queues no longer among them are deleted."""
        if not self.ks.manage_queues:
            return
        nodes = self.nodes()
        models = {d.model for n in nodes for d in n.gpus}
        capacity: dict[str, float] = {CPU: sum(n.cpu for n in nodes), MEMORY: sum(n.memory_mib for n in nodes)}
        for n in nodes:
            for d in n.gpus:
                capacity[f"{GPU}/{d.model}"] = capacity.get(f"{GPU}/{d.model}", 0.0) + 1
        deleted = kueue.sync(self.api, kueue.translate(queues, models, capacity, self.ks.cohort_per))
        if deleted:
            log.info("Kueue: removed %s", ", ".join(deleted))

    # -- nodes --------------------------------------------------------------------------------------------------
    def nodes(self) -> list[Node]:
        listed = self.core.list_node(_request_timeout=self.ks.request_timeout_s)
        return [self._node(n) for n in listed.items]

    def gpu_holders(self) -> dict[str, list[str | None]]:
        """Per node, who holds each of its GPUs (from the pod watch, no API request): a Caldera job's id, or
        OTHER_HOLDER for a pod Caldera did not start; None for a free one. Kubernetes does not say which device a
        pod got, so a pod's GPUs are listed in the order the pods were created, from device 0 on."""
        self.bound_pods.synced.wait(self.ks.request_timeout_s)
        self.node_objs.synced.wait(self.ks.request_timeout_s)
        out: dict[str, list[str | None]] = {}
        for node in self.node_objs.all():
            name = node["metadata"]["name"]
            total = int(((node.get("status") or {}).get("allocatable") or {}).get(self.ks.gpu_resource, "0") or 0)
            pods = sorted(self.bound_pods.get((name, "")), key=lambda p: p["metadata"].get("creationTimestamp") or "")
            held: list[str | None] = []
            for pod in pods:
                holder = (pod["metadata"].get("labels") or {}).get(m.LABEL_JOB) or OTHER_HOLDER
                held += [holder] * sum(_gpus_of(c, self.ks.gpu_resource) for c in pod["spec"].get("containers") or [])
            out[name] = (held + [None] * total)[: max(total, len(held))]
        return out

    def running_on(self, handle: Handle) -> set[str]:
        """The nodes kube-scheduler bound the attempt's pods to (from the pod watch), but for pods that ended."""
        self.pods.synced.wait(self.ks.request_timeout_s)
        pods = self.pods.get((m.label_value(handle.job_id), str(handle.attempt)))
        ended = ("Succeeded", "Failed")
        return {
            p["spec"]["nodeName"]
            for p in pods
            if (p.get("spec") or {}).get("nodeName") and (p.get("status") or {}).get("phase") not in ended
        }

    def set_schedulable(self, name: str, schedulable: bool) -> None:
        """Cordon (or uncordon) the cluster's node, as ``kubectl cordon`` does: kube-scheduler places no new pod."""
        body = {"spec": {"unschedulable": not schedulable}}
        self.core.patch_node(name, body, _request_timeout=self.ks.request_timeout_s)

    def _node(self, n: Any) -> Node:
        cap = n.status.allocatable or n.status.capacity or {}
        gpus = int(cap.get(self.ks.gpu_resource, "0") or 0)
        model = ((n.metadata.labels or {}).get(self.ks.gpu_model_label) or "gpu").lower()
        return Node(
            name=n.metadata.name,
            cpu=_cpu(cap.get("cpu", "0")),
            memory_mib=_mib(cap.get("memory", "0")),
            gpus=tuple(Device(i, model) for i in range(gpus)),
            schedulable=not bool(n.spec.unschedulable),
        )

    # -- re-attach ----------------------------------------------------------------------------------------------
    def attached(self) -> list[Handle]:
        """Every job attempt whose Job exists in the cluster, found by label, as after a server restart."""
        self.jobs.synced.wait(self.ks.request_timeout_s)
        out = []
        for job_id, attempt in self.jobs.job_keys():
            job = self.jobs.get((job_id, attempt))[0]
            meta, spec = job["metadata"], job["spec"]
            kind = meta["labels"].get(m.LABEL_KIND, "batch")
            per = int((meta.get("annotations") or {}).get(m.PER_REPLICA_ANNOTATION, "1"))
            data = {"namespace": meta["namespace"], "name": meta["name"], "kind": kind}
            data.update(replicas=spec["completions"], per_replica=per)
            if kind == JobKind.JUPYTER.value:
                data.update(secret=m.lab_secret_name(meta["name"]), base_url=_base_url_of(spec))
            elif kind == JobKind.VSCODE.value:
                data.update(secret=m.lab_secret_name(meta["name"]), base_url="/")
            out.append(Handle(job_id, int(attempt), data))
        return out


def _shape(handle: Handle) -> tuple[int, int]:
    """The job's pods (replicas) and ranks per pod."""
    return int(handle.data.get("replicas", 1)), int(handle.data.get("per_replica", 1))


def _completion_index(pod: dict[str, Any]) -> int:
    """Which replica the pod is: its Indexed Job's completion index."""
    return int((pod["metadata"].get("annotations") or {}).get("batch.kubernetes.io/job-completion-index", 0))


def _gpus_of(container: dict[str, Any], resource: str) -> int:
    amounts = (container.get("resources") or {}).get("limits") or (container.get("resources") or {}).get("requests")
    return int((amounts or {}).get(resource, 0) or 0)


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(t))


def _event_time(event: dict[str, Any]) -> str:
    return str(event.get("lastTimestamp") or event.get("eventTime") or event["metadata"].get("creationTimestamp") or "")


def _home_of(kind: JobKind, base_url: str) -> str:
    """Where the proxy finds the session: code-server at the root of its lab origin, Lab under its base URL."""
    return "/" if kind is JobKind.VSCODE else base_url or "/"


def _base_url_of(job_spec: dict[str, Any]) -> str:
    argv = job_spec["template"]["spec"]["containers"][0]["command"]
    flag = "--ServerApp.base_url="
    return next((a[len(flag) :] for a in argv if a.startswith(flag)), "/")


def _cpu(q: str) -> float:
    return float(q[:-1]) / 1000 if q.endswith("m") else float(q)


_UNITS = {
    "Ki": 1 / 1024,
    "Mi": 1,
    "Gi": 1024,
    "Ti": 1024**2,
    "K": 1000 / 1024**2,
    "M": 1e6 / 1024**2,
    "G": 1e9 / 1024**2,
}


def _mib(q: str) -> int:
    for unit, factor in _UNITS.items():
        if q.endswith(unit):
            return int(float(q[: -len(unit)]) * factor)
    return int(float(q) / 1024**2)
