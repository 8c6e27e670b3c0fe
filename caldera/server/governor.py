"""The server's side of governance (caldera.governance): every ``governance_interval_s`` the loop's cycle asks the
pure decisions about each running job and carries them out here: events on the job, notifications, a snapshot of
an idle Jupyter session before its stop, stops with a reason code. Prometheus is read before the state lock is
taken, time-boxed: a metrics outage never stalls scheduling, and without samples no job is called idle."""

from __future__ import annotations

import logging
import time
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from caldera.core.governance import Governance
from caldera.core.kinds import is_interactive
from caldera.core.states import JobState
from caldera.db.models import GovernanceRequest, Image, Job, JobGovernance, User
from caldera.errors import CalderaError
from caldera.governance import decide
from caldera.governance.advice import advise
from caldera.governance.decide import Action, JobFacts, Verdict
from caldera.governance.requests import account_admins
from caldera.governance.samples import job_gpu_samples, job_use
from caldera.images import catalogue, snapshot
from caldera.metrics import prometheus
from caldera.metrics.query import MetricsUnavailable
from caldera.notify import events, outbox
from caldera.runtime.base import Handle
from caldera.server import audit, tenancy
from caldera.server.jobs import note
from caldera.server.notifications import duration, gettext_for, tell
from caldera.server.platform import Platform

log = logging.getLogger(__name__)

STOP = "govern"  # Job.stop_requested of a job governance stops; the loop records it Cancelled with its reason
SNAPSHOT_NAME = "sessions"  # idle sessions are saved as tags of the owner's image of this name
SYSTEM = User(username="caldera")  # the actor of what governance does by itself, in the audit log
ADVICE_WITHIN_S = 86400.0  # jobs that finished this recently get advice (their series are surely still there)
ADVICE_PER_CYCLE = 20


def state_of(db: Session, job_id: str) -> JobGovernance:
    row = db.get(JobGovernance, job_id)
    if row is None:
        row = JobGovernance(job_id=job_id, extended_s=0.0)
        db.add(row)
    return row


def facts(job: Job, gov: JobGovernance | None) -> JobFacts:
    r = job.spec.get("resources", {})
    return JobFacts(
        id=job.id,
        kind=job.kind,
        gpus=int(r.get("gpu", 0)) * int(job.spec.get("replicas", 1)),
        started_at=job.started_at or 0.0,
        idle_warned_at=gov.idle_warned_at if gov else None,
        idle_flagged_at=gov.idle_flagged_at if gov else None,
        locked_until=gov.locked_until if gov else None,
        limit_warned_at=gov.limit_warned_at if gov else None,
        extended_s=gov.extended_s if gov else 0.0,
    )


class Governor:
    def __init__(self, platform: Platform) -> None:
        self.p = platform
        self.builds: Any = None  # the server's BuildQueue, for snapshots (set by the app)
        self._last = 0.0

    def cycle(self, now: float | None = None) -> None:
        """Called by the loop after every cycle; acts every ``governance_interval_s``. A failure is logged and
        retried at the next interval: it never fails the scheduling cycle that called it."""
        now = time.time() if now is None else now
        if now - self._last < self.p.settings.governance_interval_s:
            return
        self._last = now
        try:
            self._govern(now)
        except Exception:  # noqa: BLE001 - scheduling goes on; the next interval tries again
            log.exception("governance cycle failed")

    def _govern(self, now: float) -> None:
        with self.p.session() as db:
            rules = {name: q.governance for name, q in tenancy.all_queue_configs(db).items()}
            running = db.execute(select(Job.id, Job.queue, Job.kind).where(Job.state == JobState.RUNNING.value))
            watched = {}  # the jobs idle detection looks at, and how far back it needs their samples
            for job_id, queue, kind in running:
                rule = (rules.get(queue) or Governance()).idle_rule(kind)
                if rule.enabled:
                    watched[job_id] = rule.window_s + rule.grace_s
        try:
            prom = prometheus.client(self.p.settings)
            samples = job_gpu_samples(prom, max(watched.values()), list(watched), now) if watched else {}
        except MetricsUnavailable as exc:  # no samples: no job is idle, runtime limits still hold
            log.warning("governance without GPU samples: %s", exc)
            samples = None
        with self.p.state_lock, self.p.session() as db:
            self.apply(db, rules, samples, now)
            db.commit()
        if samples is not None:
            self.advise(now)

    def advise(self, now: float) -> None:
        """Right-sizing advice for jobs that finished in the last day and have none yet, a few per cycle."""
        prom = prometheus.client(self.p.settings)
        with self.p.session() as db:
            done = db.scalars(
                select(Job)
                .outerjoin(JobGovernance, JobGovernance.job_id == Job.id)
                .where(
                    Job.finished_at >= now - ADVICE_WITHIN_S,
                    Job.started_at.is_not(None),
                    JobGovernance.advice.is_(None),
                )
                .order_by(Job.finished_at.desc())
                .limit(ADVICE_PER_CYCLE)
            )
            for job in list(done):
                f = facts(job, None)
                if f.gpus == 0:
                    state_of(db, job.id).advice = []
                    continue
                cpu = float(job.spec.get("resources", {}).get("cpu", 0) or 0) * int(job.spec.get("replicas", 1))
                try:
                    use = job_use(prom, job.id, job.started_at, job.finished_at, f.gpus, cpu)
                except MetricsUnavailable as exc:
                    log.warning("no advice for job %s: %s", job.id, exc)
                    break
                state_of(db, job.id).advice = [{"code": a.code, "params": a.params} for a in advise(use)]
            db.commit()

    def apply(self, db: Session, rules: dict[str, Governance], samples: dict | None, now: float) -> None:
        expire_locks(db, now)
        running = db.scalars(select(Job).where(Job.state == JobState.RUNNING.value, Job.stop_requested.is_(None)))
        for job in list(running):
            rule = rules.get(job.queue) or Governance()
            gov = db.get(JobGovernance, job.id)
            if gov is not None and gov.pending_stop is not None:
                self._after_snapshot(db, job, gov, now)
                continue
            f = facts(job, gov)
            limit = decide.runtime(f, rule.runtime_limit(job.kind), self.p.settings.runtime_limit_warning_s, now)
            if limit.action is not Action.NONE:
                self._runtime(db, job, limit, now)
                if limit.action is Action.STOP:
                    continue
            if samples is not None:
                verdict = decide.idle(
                    f, rule.idle_rule(job.kind), samples.get(job.id, {}), now, self.p.settings.idle_max_gap_s
                )
                self._idle(db, job, verdict, now)

    # ---- runtime limits
    def _runtime(self, db: Session, job: Job, v: Verdict, now: float) -> None:
        if v.action is Action.WARN:
            state_of(db, job.id).limit_warned_at = now
            left = duration(v.params["left_s"])
            note(db, job, "RuntimeLimitWarning", f"stops at its runtime limit in {left}", {"left": left})
            tell(db, job, events.RUNTIME_LIMIT_WARNING, {"left": left}, now)
        elif v.action is Action.STOP:
            limit = duration(v.params["limit_s"])
            self.stop(db, job, "RuntimeLimitReached", f"stopped at its runtime limit of {limit}", {"limit": limit})
            tell_account_admins(db, job, events.FLAG_LIMIT, limit, now)

    # ---- idle GPUs
    def _idle(self, db: Session, job: Job, v: Verdict, now: float) -> None:
        if v.action is Action.NONE:
            return
        gov = state_of(db, job.id)
        if v.action is Action.CLEAR:
            if gov.idle_warned_at is not None and v.reason in ("Busy", "BusyAgain"):  # a lock says so itself
                note(db, job, "IdleCleared", "its GPUs are in use again: it is not stopped", {})
            gov.idle_warned_at = gov.idle_flagged_at = None
            return
        window, grace = duration(v.params["window_s"]), duration(v.params["grace_s"])
        values = {"window": window, "grace": grace, "percent": v.params["percent"]}
        if v.action is Action.WARN:
            gov.idle_warned_at = now
            note(
                db, job, "IdleWarning",
                f"its GPUs averaged {v.params['percent']}% over {window}; stopped in {grace} unless used", values,
            )  # fmt: skip
            tell(db, job, events.IDLE_WARNING, {"window": window, "grace": grace}, now)
        elif v.action is Action.FLAG:
            gov.idle_flagged_at = now
            note(db, job, "IdleFlagged", f"its GPUs averaged {v.params['percent']}% over {window}", values)
            tell(db, job, events.IDLE_FLAG, {"window": window}, now)
            tell_account_admins(db, job, events.FLAG_IDLE, window, now)
        elif v.action is Action.STOP:
            self._idle_stop(db, job, gov, values, now)

    def _idle_stop(self, db: Session, job: Job, gov: JobGovernance, values: dict, now: float) -> None:
        """A session (any interactive kind) in a container is saved first (the stop waits for the snapshot); any
        other job stops now. Its workspace always stays."""
        message = f"stopped: its GPUs stayed idle for {values['window']} and {values['grace']} after the warning"
        if is_interactive(job.kind) and self.p.settings.runtime == "container" and self.builds is not None:
            owner = db.get(User, job.user_id)
            try:
                img = snapshot.start(self.p, self.builds, db, owner, job, SNAPSHOT_NAME, f"idle-{job.id}-{job.attempt}")
            except CalderaError as exc:
                note(
                    db, job, "IdleSnapshotFailed", f"could not save the session: {exc.message}", {"error": exc.message}
                )
            else:
                gov.snapshot_image, gov.pending_stop = img.id, {"message": message, "params": values, "at": now}
                ref = f"{img.namespace}/{img.name}:{img.tag}"
                note(db, job, "IdleSnapshot", f"saving the session as {ref} before stopping it", {"snapshot": ref})
                return
        self.stop(db, job, "IdleStopped", message, values)

    def _after_snapshot(self, db: Session, job: Job, gov: JobGovernance, now: float) -> None:
        pending = gov.pending_stop or {}
        img = db.get(Image, gov.snapshot_image) if gov.snapshot_image else None
        building = img is not None and img.state == "building"
        if building and now - pending.get("at", now) < self.p.settings.idle_snapshot_timeout_s:
            return
        values, message = dict(pending.get("params") or {}), pending.get("message", "stopped: idle")
        if img is not None and img.state == "ready":
            values["snapshot"] = catalogue.reference(self.p.settings, img)
            message += f"; the session was saved as {values['snapshot']}"
        gov.pending_stop = None
        self.stop(db, job, "IdleStopped", message, values)

    def stop(self, db: Session, job: Job, reason: str, message: str, params: dict[str, Any]) -> None:
        """SIGTERM now, SIGKILL after the cancel grace; the loop records the job Cancelled with ``reason``."""
        job.stop_requested = STOP
        job.stop_detail = {"reason": reason, "message": message, "params": params}
        note(db, job, reason, message, params)
        if job.handle:
            runtime = self.p.runtime_of(job.runtime, job.handle)
            runtime.stop(Handle(job.id, job.attempt, job.handle), self.p.settings.cancel_grace_s)


def tell_account_admins(db: Session, job: Job, flag: str, after: str, now: float) -> None:
    """A flag (``events.FLAG_*``) told to the admins of the job's account as well, on their own preference for
    ``account_flag`` (the job's ``notify:`` is its owner's choice, not theirs); an owner who is one is told once."""
    owner = db.get(User, job.user_id)
    params = {"job": job.name, "user": owner.username if owner else "", "account": job.account}
    for admin in account_admins(db, job.account):
        if admin.id != job.user_id:
            outbox.notify(db, admin.id, events.ACCOUNT_FLAG, params | {"flag": flag, "after": after}, gettext_for,
                          None, job.id, now)  # fmt: skip


def expire_locks(db: Session, now: float) -> None:
    """Approved locks whose time ran out: an event on the job and an entry in the audit log."""
    for gov in db.scalars(select(JobGovernance).where(JobGovernance.locked_until <= now)):
        gov.locked_until = None
        job = db.get(Job, gov.job_id)
        for req in db.scalars(
            select(GovernanceRequest).where(
                GovernanceRequest.job_id == gov.job_id,
                GovernanceRequest.kind == "lock",
                GovernanceRequest.state == "approved",
            )
        ):
            req.state = "expired"
            audit.record(db, SYSTEM, "governance.expire", f"job {gov.job_id}", {"request": req.id})
        if job is not None:
            note(db, job, "LockExpired", "its lock expired: idle GPUs may stop it again", {})
