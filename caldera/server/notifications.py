"""The server's side of notifications: which job transitions tell their user, in the user's language, and the
dispatcher thread that delivers the outbox (caldera.notify.outbox) beside the scheduling loop, never inside it."""

from __future__ import annotations

import logging
import threading
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from caldera.core.arrays import array_state
from caldera.core.states import JobState
from caldera.db.models import Job
from caldera.notify import events, outbox
from caldera.notify.registry import create_notifiers
from caldera.server.platform import Platform

log = logging.getLogger(__name__)

ENDED = {
    JobState.SUCCEEDED: events.JOB_SUCCEEDED,
    JobState.FAILED: events.JOB_FAILED,
    JobState.PREEMPTED: events.JOB_PREEMPTED,
    JobState.LOST: events.JOB_LOST,
}


def gettext_for(lang: str):
    # imported here: the web package's __init__ loads every page, which import jobs, which imports this module
    from caldera.server.web.i18n import translations

    return translations(lang).gettext


def tell(db: Session, job: Job, event: str, params: dict[str, Any], now: float | None = None) -> None:
    """Record ``event`` about ``job`` for its user (the job's ``notify:`` narrows their choice)."""
    outbox.notify(db, job.user_id, event, {"job": job.name, **params}, gettext_for, job.spec, job.id, now)


def on_transition(db: Session, job: Job, to: JobState, message: str, now: float) -> None:
    """Called by ``jobs.record`` for every state change: the end of an attempt tells the user; a job array's tasks
    tell once, when the last of them ends."""
    if job.array_id is not None and to.terminal:  # a cancelled task too: it may be the last of a failed array
        _on_task_ended(db, job, to, now)
        return
    if to not in ENDED:
        return
    tell(db, job, ENDED[to], {"message": message}, now)


def _on_task_ended(db: Session, job: Job, to: JobState, now: float) -> None:
    """As Slurm mails about an array, not each task: a 100-task sweep is one message, its tasks counted."""
    others = db.scalars(select(Job.state).where(Job.array_id == job.array_id, Job.id != job.id))
    states = [JobState(s) for s in others] + [to]
    if not all(s.terminal for s in states):
        return
    event = ENDED.get(array_state(states))  # Cancelled tells nothing, as for a job
    if event is not None:
        counts = ", ".join(f"{states.count(s)} {s.value}" for s in JobState if states.count(s))
        tell(db, job, event, {"job": f"{job.name}[{len(states)} tasks]", "message": counts}, now)


def on_running(db: Session, job: Job, wait_threshold_s: float, now: float) -> None:
    """Called by the loop when a job's processes run: tells the user when it waited longer than the threshold."""
    if job.queued_at is None or job.started_at is None:
        return
    waited = job.started_at - job.queued_at
    if waited > wait_threshold_s:
        tell(db, job, events.JOB_STARTED_AFTER_WAIT, {"waited": duration(waited)}, now)


def duration(seconds: float) -> str:
    minutes = int(seconds // 60)
    hours, minutes = divmod(minutes, 60)
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h" if days else f"{hours}h {minutes}m" if hours else f"{minutes}m"


class Dispatcher:
    """Delivers due outbox rows every ``interval_s`` on its own thread."""

    def __init__(self, platform: Platform, interval_s: float = 5.0) -> None:
        self.p = platform
        self.interval_s = interval_s
        self.notifiers = create_notifiers(platform.settings)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="caldera-notify", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=self.p.settings.notify_timeout_s + 5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                outbox.dispatch(self.p.sessions, self.notifiers, self.p.settings)
            except Exception:  # a bad round must not end deliveries; the next one retries
                log.exception("notification dispatch failed")
            self._stop.wait(self.interval_s)
