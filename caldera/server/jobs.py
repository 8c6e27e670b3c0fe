"""Job rules independent of HTTP: submission, visibility, cancellation, state changes with their events."""

from __future__ import annotations

import secrets
import time
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from caldera.core.spec import JobSpec
from caldera.core.states import JobState, check_transition
from caldera.core.tenancy import PriorityClass, QueueConfig, Role
from caldera.db.models import Job, JobArray, JobEventRow, User
from caldera.images import catalogue
from caldera.runtime.base import Handle
from caldera.scheduler.quota import never_fits
from caldera.server import files, notifications, tenancy
from caldera.server.errors import Forbidden, Invalid, NotFound
from caldera.server.platform import Platform
from caldera.server.queue_positions import QueuePositions


def record(
    db: Session,
    job: Job,
    to: JobState,
    reason: str,
    message: str = "",
    now: float | None = None,
    params: dict[str, Any] | None = None,
) -> None:
    """The one way a job changes state: checked against the state machine, and always leaves an event. ``params``:
    the values ``message`` was made from, for the portal to say it in its reader's language (reason_text.py)."""
    now = time.time() if now is None else now
    src = JobState(job.state) if job.state else None
    if src is not None:
        check_transition(src, to)
    job.state = to.value
    job.reason = reason
    job.message = message
    db.add(
        JobEventRow(
            job_id=job.id,
            at=now,
            from_state=src.value if src else None,
            to_state=to.value,
            reason=reason,
            message=message,
            details=params,
        )
    )
    notifications.on_transition(db, job, to, message, now)


def note(db: Session, job: Job, reason: str, message: str, params: dict[str, Any] | None = None) -> None:
    """An event that is not a transition (e.g. a preemption was requested)."""
    db.add(
        JobEventRow(
            job_id=job.id,
            at=time.time(),
            from_state=job.state,
            to_state=job.state,
            reason=reason,
            message=message,
            details=params,
        )
    )


def submit(p: Platform, db: Session, user: User, spec: JobSpec) -> Job:
    spec, account, queue = admissible(p, db, user, spec)
    job = create(db, user, spec, account, queue, time.time())
    db.flush()
    return job


def admissible(p: Platform, db: Session, user: User, spec: JobSpec) -> tuple[JobSpec, str, str]:
    """The spec as it will be stored (the catalogue's image reference), its account and its queue; Invalid or
    Forbidden where the user may not submit it, or it could never start."""
    account = spec.account or user.default_account
    if not account:
        raise Invalid("account", "you belong to no account; ask an admin to add you to one", "NoAccount")
    try:
        tenancy.get_account(db, account)
    except NotFound:
        raise Invalid("account", f"unknown account {account!r}", "UnknownAccount", {"account": account}) from None
    if user.role != Role.ADMIN.value and not tenancy.is_member(db, user, account):
        raise Invalid("account", f"you are not a member of account {account!r}", "NotAMember", {"account": account})
    files.check_mounts(p, db, user, spec)
    files.check_publish(p, db, user, spec)
    _check_dependencies(db, user, spec)
    if spec.image:  # the runtime gets the catalogue's reference, never the user's string
        spec = spec.model_copy(update={"image": catalogue.resolve_job_image(db, p.settings, user, spec.image)})
    if spec.queue:
        try:
            _, owner = tenancy.get_queue(db, spec.queue)
        except NotFound:
            raise Invalid("queue", f"unknown queue {spec.queue!r}", "UnknownQueue", {"queue": spec.queue}) from None
        if owner != account:
            raise Invalid(
                "queue",
                f"queue {spec.queue!r} belongs to account {owner!r}, not {account!r}",
                "QueueOfAnotherAccount",
                {"queue": spec.queue, "owner": owner, "account": account},
            )
        queue = spec.queue
    else:
        queue = tenancy.default_queue(db, account)
    why = never_fits(spec.resources, spec.replicas, p.nodes())
    if why:
        raise Invalid("resources", why)
    q, _ = tenancy.get_queue(db, queue)
    cfg = tenancy.queue_config(q, account)
    _check_priority(cfg, user, spec)
    over = over_caps(cfg, spec)
    if over:
        raise Invalid("resources", *over)
    return spec, account, queue


def create(
    db: Session,
    user: User,
    spec: JobSpec,
    account: str,
    queue: str,
    now: float,
    array: tuple[str, int] | None = None,
    job_id: str | None = None,
) -> Job:
    """A queued job of an admissible spec; ``array``: the array and index of a task; ``job_id`` one of ``new_ids``."""
    job = Job(
        id=job_id or new_id(db),
        name=spec.name,
        user_id=user.id,
        account=account,
        queue=queue,
        kind=spec.kind.value,
        priority=spec.priority.value,
        spec=spec.model_dump(mode="json"),
        state="",
        submitted_at=now,
        attempt=0,
        allocations=[],
        pending_reasons=[],
        array_id=array[0] if array else None,
        array_index=array[1] if array else None,
    )
    db.add(job)
    record(db, job, JobState.PENDING, "Submitted", f"submitted by {user.username}", now, {"user": user.username})
    record(db, job, JobState.QUEUED, "Admitted", f"queued in {queue}", now, {"queue": queue})
    job.queued_at = now
    return job


def new_id(db: Session) -> str:
    """An id that no job and no job array has (arrays and jobs share one name space: ``--after`` takes either)."""
    return new_ids(db, 1)[0]


def new_ids(db: Session, n: int) -> list[str]:
    """``n`` such ids, checked a batch at a time (an array's thousand tasks are not two thousand lookups)."""
    ids: set[str] = set()
    while len(ids) < n:
        candidates = {secrets.token_hex(5) for _ in range(min(n - len(ids), _ID_BATCH))} - ids
        taken = set(db.scalars(select(Job.id).where(Job.id.in_(candidates))))
        taken |= set(db.scalars(select(JobArray.id).where(JobArray.id.in_(candidates))))
        ids |= candidates - taken
    return list(ids)


_ID_BATCH = 500  # bound parameters per lookup: under every database's limit


def _check_dependencies(db: Session, user: User, spec: JobSpec) -> None:
    """A job waits only for jobs and job arrays its owner may see (an unknown id would make it wait for ever)."""
    for after in spec.after:
        try:
            visible(db, user, after.job)
        except NotFound:
            try:
                visible_array(db, user, after.job)
            except NotFound:
                raise Invalid("after", f"no job {after.job!r}", "UnknownDependency", {"job": after.job}) from None


def _check_priority(cfg: QueueConfig, user: User, spec: JobSpec) -> None:
    """Classes above normal jump the queue and preempt, so they need an admin's grant (admins need none)."""
    if spec.priority.rank <= PriorityClass.NORMAL.rank or user.role == Role.ADMIN.value:
        return
    if not cfg.allows(user.username, spec.priority):
        granted = cfg.priority_grants.get(user.username, cfg.max_priority)
        raise Forbidden(
            f"priority {spec.priority.value} needs a grant in queue {cfg.name}: you may submit up to "
            f"{granted.value} there; an admin grants more with `caldera queue grant {cfg.name} "
            f"{user.username} {spec.priority.value}`",
            "PriorityNeedsGrant",
            {"priority": spec.priority.value, "queue": cfg.name, "granted": granted.value, "user": user.username},
        )


def over_caps(cfg: QueueConfig, spec: JobSpec) -> tuple[str, str, dict[str, Any]] | None:
    """Why a job can never start under its queue's per-user caps or capabilities, however idle the cluster: the
    English reason, its code and its parameters."""
    caps = cfg.user_caps
    gpus = spec.total_gpus()
    q = {"queue": cfg.name}
    if caps.max_gpus is not None and gpus > caps.max_gpus:
        why = f"the job needs {gpus} GPUs but queue {cfg.name} caps each user at {caps.max_gpus} (user_caps.max_gpus)"
        return why, "OverUserGpuCap", {**q, "gpus": gpus, "limit": caps.max_gpus}
    if caps.max_running_jobs == 0:
        return f"queue {cfg.name} lets no user run jobs (user_caps.max_running_jobs is 0)", "NoRunningJobs", q
    if spec.interactive and caps.max_interactive_jobs == 0:
        why = f"queue {cfg.name} allows no interactive jobs (user_caps.max_interactive_jobs is 0)"
        return why, "NoInteractiveJobs", q
    for key, amount in spec.resources.vector(spec.replicas).items():
        quota = cfg.quotas.get(key)
        if quota is not None and quota.capability is not None and amount > quota.capability:
            why = (
                f"the job needs {amount:g} {key} but queue {cfg.name} can never use more than "
                f"{quota.capability:g} (its capability for {key})"
            )
            params = {**q, "amount": f"{amount:g}", "resource": key, "capability": f"{quota.capability:g}"}
            return why, "OverCapability", params
    return None


def visible(db: Session, user: User, job_id: str) -> Job:
    """A job the user may see: their own, or any for an admin. Others' jobs do not exist for them."""
    job = db.get(Job, job_id)
    if job is None or (job.user_id != user.id and user.role != Role.ADMIN.value):
        raise NotFound(f"no job {job_id!r}")
    return job


def visible_array(db: Session, user: User, array_id: str) -> JobArray:
    """A job array the user may see, as ``visible`` a job."""
    array = db.get(JobArray, array_id)
    if array is None or (array.user_id != user.id and user.role != Role.ADMIN.value):
        raise NotFound(f"no job array {array_id!r}")
    return array


def jobs_query(
    user: User,
    everyone: bool = False,
    states: list[str] | None = None,
    owner_id: int | None = None,
    queue: str | None = None,
) -> Select:
    """The user's jobs (an admin's ``everyone``: all of them), unordered; ``owner_id`` and ``queue`` narrow an
    admin's view of everyone's jobs."""
    q = select(Job)
    if not (everyone and user.role == Role.ADMIN.value):
        q = q.where(Job.user_id == user.id)
    elif owner_id is not None:
        q = q.where(Job.user_id == owner_id)
    if states:
        q = q.where(Job.state.in_(states))
    if queue:
        q = q.where(Job.queue == queue)
    return q


def list_jobs(
    db: Session,
    user: User,
    everyone: bool = False,
    states: list[str] | None = None,
    limit: int = 200,
) -> list[Job]:
    """Newest first."""
    q = jobs_query(user, everyone, states)
    return list(db.scalars(q.order_by(Job.submitted_at.desc()).limit(limit)))


def events(db: Session, job: Job) -> list[JobEventRow]:
    return list(db.scalars(select(JobEventRow).where(JobEventRow.job_id == job.id).order_by(JobEventRow.id)))


def current_events(db: Session, listed: list[Job]) -> dict[str, JobEventRow]:
    """Per job, the newest event that set its current reason and message: what the portal renders that message
    from in its reader's language (the event has the parameters, the job only the English)."""
    if not listed:
        return {}
    q = (
        select(JobEventRow)
        .join(Job, Job.id == JobEventRow.job_id)
        .where(Job.id.in_([j.id for j in listed]), JobEventRow.reason == Job.reason, JobEventRow.message == Job.message)
        .order_by(JobEventRow.id)
    )
    return {e.job_id: e for e in db.scalars(q)}


def cancel(p: Platform, db: Session, job: Job, actor: User) -> Job:
    """Queued jobs are cancelled at once; running ones get SIGTERM, then SIGKILL after the grace period, and
    become Cancelled when their processes are gone."""
    if job.user_id != actor.id and actor.role != Role.ADMIN.value:
        raise Forbidden("not your job")
    state = JobState(job.state)
    if state.terminal:
        return job
    if state in (JobState.PENDING, JobState.QUEUED, JobState.PREEMPTED):
        by = {"by": actor.username}
        record(db, job, JobState.CANCELLED, "CancelledByUser", f"cancelled by {actor.username}", params=by)
        job.finished_at = time.time()
        return job
    if job.stop_requested != "cancel":
        job.stop_requested = "cancel"
        job.stop_detail = {"by": actor.username}
        note(
            db,
            job,
            "CancelRequested",
            f"cancelled by {actor.username}; SIGTERM, SIGKILL after {p.settings.cancel_grace_s:g}s",
            {"by": actor.username, "grace_s": f"{p.settings.cancel_grace_s:g}"},
        )
        if job.handle:
            p.runtime_of(job.runtime, job.handle).stop(
                Handle(job.id, job.attempt, job.handle), p.settings.cancel_grace_s
            )
    return job


def preemption_deadline(now: float, grace_s: float) -> str:
    return datetime.fromtimestamp(now + grace_s, UTC).isoformat()


def request_preemption(
    p: Platform,
    db: Session,
    job: Job,
    by: str | None,
    reason: str,
    message: str,
    now: float,
    params: dict[str, Any] | None = None,
):
    """Ask a running job to stop for someone else (``by``, a job id) or for its node (``by`` None): SIGTERM with the
    notice now, SIGKILL after the grace; the loop re-queues it when it ends. ``params``: what ``message`` says
    beyond ``by`` (e.g. the drained node), for the event's rendering."""
    deadline = preemption_deadline(now, p.settings.preempt_grace_s)
    params = {"by": by, **(params or {})}
    job.stop_requested = "preempt"
    job.stop_detail = {"by": by, "reason": reason, "message": message, "deadline": deadline, "params": params}
    note(
        db,
        job,
        "PreemptionRequested",
        f"{message}; SIGTERM now, SIGKILL at {deadline}",
        {**params, "cause": reason, "deadline": deadline},
    )
    if job.handle:
        p.runtime_of(job.runtime, job.handle).stop(
            Handle(job.id, job.attempt, job.handle), p.settings.preempt_grace_s, notice=preemption_notice(job)
        )


def preemption_notice(job: Job) -> str:
    """What a preempted job finds in its CALDERA_PREEMPT_NOTICE file (documented in the README)."""
    detail = job.stop_detail or {}
    return f"preempted: {detail.get('message', '')}\ndeadline: {detail.get('deadline', '')}\n"


def view(job: Job, username: str | None = None, *, positions: QueuePositions) -> dict[str, Any]:
    """A job as the API shows it; its pending reasons with its place in the queue (``positions``)."""
    return {
        "id": job.id,
        "name": job.name,
        "user": username,
        "account": job.account,
        "queue": job.queue,
        "kind": job.kind,
        "priority": job.priority,
        "state": job.state,
        "reason": job.reason,
        "message": job.message,
        "attempt": job.attempt,
        "submitted_at": job.submitted_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "exit_code": job.exit_code,
        "allocations": job.allocations,
        "runtime": job.runtime,
        "pending_reasons": positions.shown(job),
        "hold": job.hold,
        "array_id": job.array_id,
        "array_index": job.array_index,
        "spec": job.spec,
        "gpus": total_gpus(job),
        # the spec's publish once the job has succeeded: pending, then published (its ref) or failed (why)
        "publish": None if job.publish_state is None else {"state": job.publish_state, **(job.publish_result or {})},
    }


def total_gpus(job: Job) -> int:
    """The GPUs of all the job's replicas (the spec as stored, which the API validated)."""
    return job.spec.get("resources", {}).get("gpu", 0) * job.spec.get("replicas", 1)


def event_view(e: JobEventRow) -> dict[str, Any]:
    return {"at": e.at, "from": e.from_state, "to": e.to_state, "reason": e.reason, "message": e.message}
