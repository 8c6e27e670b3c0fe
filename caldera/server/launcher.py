"""Launches off the scheduling loop: a runtime may take seconds to start a job (every rank's supervisor, a container,
a pod), and the loop must keep scheduling, observing and answering meanwhile.

The loop marks a job Starting, with its allocation, durably before it hands the launch here; the handle is stored
when the launch returns. A job cancelled or preempted while its launch was in flight is stopped as soon as the
handle exists; a launch that fails fails the job with the runtime's reason.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait

from caldera.core.states import JobState
from caldera.db.models import Job
from caldera.runtime.base import Handle, LaunchError, LaunchRequest
from caldera.server.jobs import preemption_notice, record
from caldera.server.platform import Platform

log = logging.getLogger("caldera.launcher")


class Launcher:
    def __init__(self, platform: Platform, workers: int = 8):
        self.p = platform
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="caldera-launch")
        self._inflight: dict[tuple[str, int], Future[None]] = {}
        self._lock = threading.Lock()

    def submit(self, req: LaunchRequest) -> None:
        key = (req.job_id, req.attempt)
        with self._lock:  # registered before the loop moves on, so it never observes a launch that has not begun
            self._inflight[key] = self._pool.submit(self._launch, req)

    def in_flight(self, job_id: str, attempt: int) -> bool:
        with self._lock:
            return (job_id, attempt) in self._inflight

    def drain(self, timeout: float | None = None) -> None:
        """Wait for the launches in flight (tests, and shutdown)."""
        with self._lock:
            futures = list(self._inflight.values())
        wait(futures, timeout=timeout)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)

    def _launch(self, req: LaunchRequest) -> None:
        try:
            self._launch_and_record(req)
        finally:
            with self._lock:
                self._inflight.pop((req.job_id, req.attempt), None)

    def _launch_and_record(self, req: LaunchRequest) -> None:
        try:
            handle = self.p.runtime.launch(req)
        except Exception as exc:  # noqa: BLE001 - a launch failure fails this job, never the platform
            reason = exc.reason if isinstance(exc, LaunchError) else "LaunchFailed"
            log.warning("launch of %s failed (%s): %s", req.job_id, reason, exc)
            self._failed(req, reason, str(exc))
            return
        try:
            self._launched(req, handle)
        except Exception:
            log.exception("could not record the launch of %s; stopping it", req.job_id)
            self.p.runtime.stop(handle, 0)
            raise

    def _launched(self, req: LaunchRequest, handle: Handle) -> None:
        with self.p.state_lock, self.p.session() as db:
            job = db.get(Job, req.job_id)
            if job is None or job.state != JobState.STARTING.value or job.attempt != req.attempt:
                self.p.runtime.stop(handle, 0)  # gone or changed while it launched: nobody wants these processes
                return
            job.handle = handle.data
            db.commit()
            if job.stop_requested == "cancel":
                self.p.runtime.stop(handle, self.p.settings.cancel_grace_s)
            elif job.stop_requested == "preempt":
                self.p.runtime.stop(handle, self.p.settings.preempt_grace_s, notice=preemption_notice(job))

    def _failed(self, req: LaunchRequest, reason: str, message: str) -> None:
        with self.p.state_lock, self.p.session() as db:
            job = db.get(Job, req.job_id)
            if job is None or job.attempt != req.attempt or JobState(job.state).terminal:
                return
            record(db, job, JobState.FAILED, reason, message, params={"error": message})
            job.finished_at = time.time()
            db.commit()
