"""The live scheduling loop: observe runtimes, charge usage, ask the policy, apply its decisions.

It calls the same pure policy function the simulator calls; everything here is about turning database rows into a
snapshot and decisions back into state changes, durably. Order matters for crash safety: a job is marked Starting
with its allocation *before* launch, and its handle is stored right after (see launcher.py, which runs launches off
this loop), so a restart finds every process.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections import ChainMap
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from sqlalchemy import bindparam, select, update
from sqlalchemy.orm import Session

from caldera.core.cluster import Allocation
from caldera.core.spec import JobKind, JobSpec
from caldera.core.states import JobState
from caldera.db.models import Job, Usage, User
from caldera.errors import CalderaError
from caldera.interference.snapshot import LivePredictions
from caldera.runtime import gpu_share
from caldera.runtime.base import Handle, LaunchRequest, Phase, Runtime
from caldera.scheduler import fairshare
from caldera.scheduler.reasons import said_reasons, specific_reasons
from caldera.scheduler.registry import get_policy
from caldera.scheduler.sharing import SharingPolicy
from caldera.scheduler.snapshot import Decisions, Policy, Reason, Snapshot, Start
from caldera.scheduler.validation import valid_decisions
from caldera.server import cordons, files, holds, identity, job_publish, notifications, tenancy, user_keys
from caldera.server.governor import STOP, Governor
from caldera.server.jobs import note, record, request_preemption
from caldera.server.launcher import Launcher
from caldera.server.learned_runtimes import expected_runtimes
from caldera.server.platform import Platform
from caldera.server.queue_positions import as_stored
from caldera.server.snapshot_jobs import QUEUED, QueuedCycle, SnapshotJobs, sched_job
from caldera.server.solo_profiles import SoloProfiler

log = logging.getLogger("caldera.loop")
_DRIFTS = "estimated_start"


def reasons_changed(stored: list[dict], new: list[dict]) -> bool:
    """Whether a queued job's stored reasons need rewriting. Estimated starts drift a little every cycle as time
    passes; rewriting every queued job's row each second for that would be most of the loop's writes, so they are
    rewritten when what a person reads changes: a code, a message (which shows the estimate as HH:MM) or any other
    detail."""
    if len(stored) != len(new):
        return True
    for a, b in zip(stored, new):
        if a.get("code") != b["code"] or a.get("message") != b["message"]:
            return True
        da, dn = a.get("details") or {}, b["details"] or {}
        if da.keys() != dn.keys() or any(da[k] != v for k, v in dn.items() if k != _DRIFTS):
            return True
    return False


ACTIVE = (JobState.STARTING.value, JobState.RUNNING.value)
# how long a running attempt may fail to be observed before its processes are ended and it is called Lost
_UNOBSERVABLE_GRACE_S = 120.0


def lab_base_url(job_id: str) -> str:
    return f"/jobs/{job_id}/lab/"


def _alloc_to_json(a: Allocation) -> dict:
    return {"node": a.node, "gpus": list(a.gpus), "cpu": a.cpu, "memory_mib": a.memory_mib}


def _alloc_from_json(d: dict) -> Allocation:
    return Allocation(d["node"], tuple(d["gpus"]), d["cpu"], d["memory_mib"])


def _gpus(job: Job) -> int:
    r = job.spec.get("resources", {})
    return int(r.get("gpu", 0)) * int(job.spec.get("replicas", 1))


class SchedulerLoop:
    def __init__(self, platform: Platform, policy: Policy | None = None):
        self.p = platform
        self.policy = policy or get_policy(platform.settings.policy)
        # GPU sharing: the policy decides as if GPUs were exclusive, then shareable jobs join occupied GPUs where
        # the decay model's predictions (put into each snapshot) say it pays
        self.predictions = LivePredictions(platform.settings) if platform.settings.gpu_sharing else None
        if self.predictions is not None and not isinstance(self.policy, SharingPolicy):
            self.policy = SharingPolicy(self.policy)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_charge: float | None = None
        self.last_decisions: Decisions | None = None
        self.cycle_ms: float = 0.0
        self.launcher = Launcher(platform)
        self._pushed_queues: str | None = None  # the queues the runtime last accepted (admitting runtimes)
        # attempts the runtime failed to observe, since when (cleared once observed again)
        self._unobservable_since: dict[tuple[str, int], float] = {}
        s = platform.settings
        self.profiles = SoloProfiler(s, platform.runtime) if s.gpu_sharing and s.sharing_profile_s else None
        self.governor = Governor(platform)  # idle GPUs and runtime limits, after each cycle
        self.jobs = SnapshotJobs()  # the queued jobs as the policy sees them, kept between cycles
        self._cycle: QueuedCycle | None = None  # this cycle's queued jobs, from the snapshot to the decisions
        self.publisher = job_publish.Publisher(platform)  # succeeded jobs' output into the catalogue, off the loop
        self._to_publish = False  # a job of this cycle succeeded with a folder to publish

    # ---- lifecycle -------------------------------------------------------------------------------------------
    def start(self) -> None:
        self.recover()
        self._thread = threading.Thread(target=self._run, name="caldera-scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=10)
        self.launcher.shutdown()
        self.publisher.stop()
        if self.profiles is not None:
            self.profiles.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # the loop must survive one bad cycle; the next one retries
                log.exception("scheduling cycle failed")
            self._stop.wait(self.p.settings.schedule_interval_s)

    def recover(self) -> None:
        """After a restart: re-attach to running jobs, each through the runtime that launched it; mark those whose
        processes are gone Lost. Queued jobs simply stay queued."""
        with self.p.state_lock, self.p.session() as db:
            now = time.time()
            for job in db.scalars(select(Job).where(Job.state.in_(ACTIVE))):
                try:
                    runtime = self._runtime_of(job)
                    obs = runtime.observe(self._handle(job))
                except Exception as exc:  # noqa: BLE001 - a record no runtime can read: see _unobservable
                    self._unobservable(db, job, exc, now, at_restart=True)
                    continue
                if obs.phase in (Phase.STARTING, Phase.RUNNING):
                    message = f"server restarted; processes still running ({runtime.name} runtime)"
                    note(db, job, "Reattached", message, {"runtime": runtime.name})
                else:
                    self._finish(db, job, obs.phase, obs.exit_code, obs.reason, obs.message, now)
            db.commit()
        self._to_publish = False
        self.publisher.kick()  # jobs a stopped server left pending too

    def _runtime_of(self, job: Job) -> Runtime:
        return self.p.runtime_of(job.runtime, job.handle)

    @staticmethod
    def _handle(job: Job) -> Handle:
        return Handle(job.id, job.attempt, job.handle or {})

    def _unobservable(self, db: Session, job: Job, exc: Exception, now: float, at_restart: bool = False) -> None:
        """An attempt its runtime cannot observe (a record it cannot parse, a runtime that cannot start here) is
        Lost only once every process of it was found and ended; until then it stays active and keeps its devices,
        so none is handed out twice, and the next cycle tries again. Its processes are ended at a restart, or once
        observing has failed for ``_UNOBSERVABLE_GRACE_S``: a passing failure (a podman command that timed out on a
        loaded host) must not kill a job that runs."""
        key = (job.id, job.attempt)
        first = key not in self._unobservable_since
        since = self._unobservable_since.setdefault(key, now)
        if (at_restart or now - since >= _UNOBSERVABLE_GRACE_S) and self._ended_everything(job):
            record(
                db,
                job,
                JobState.LOST,
                "ReattachFailed",
                f"could not re-attach: {exc}; every process of attempt {job.attempt} was found and ended",
                now,
                {"error": str(exc), "attempt": job.attempt},
            )
            job.finished_at = now
            job.stop_requested, job.stop_detail = None, None
            del self._unobservable_since[key]
            return
        log.warning("cannot observe attempt %s of job %s: %s", job.attempt, job.id, exc)
        if first:
            note(
                db,
                job,
                "Unobservable",
                f"cannot observe attempt {job.attempt}: {exc}; its devices stay held until its processes are found "
                "ended",
                {"error": str(exc), "attempt": job.attempt},
            )

    def _ended_everything(self, job: Job) -> bool:
        try:
            end_attempt = getattr(self._runtime_of(job), "end_attempt", None)
            return bool(end_attempt is not None and end_attempt(job.id, job.attempt))
        except Exception as exc:  # noqa: BLE001 - not sure: the devices stay held
            log.warning("cannot end attempt %s of job %s: %s", job.attempt, job.id, exc)
            return False

    # ---- one cycle -------------------------------------------------------------------------------------------
    def tick(self) -> Decisions:
        t0 = time.perf_counter()
        now = time.time()
        with self.p.state_lock, self.p.session() as db, self._forgotten_if_undone():
            self._observe(db, now)
            running = list(db.scalars(select(Job).where(Job.state == JobState.RUNNING.value)))
            names = tenancy.usernames(db)
            user_usage, queue_usage = self._charge(db, now, running, names)
            self._profile(db, running, now)
            if getattr(self.p.runtime, "admits_jobs", False):
                self._push_queues(db)
                decisions = self._hand_over(db, now)
            else:
                snap = self._snapshot(db, now, user_usage, queue_usage, names)
                decisions = self._checked(snap, self.policy(snap))
            self._apply(db, decisions, now)
            db.commit()
            self.p.queue_positions.after_cycle(decisions.pending)
        if self._to_publish:  # once committed: the publisher reads the pending jobs in a session of its own
            self._to_publish = False
            self.publisher.kick()
        self.governor.cycle(now)
        self.last_decisions = decisions
        self.cycle_ms = (time.perf_counter() - t0) * 1000
        return decisions

    @contextlib.contextmanager
    def _forgotten_if_undone(self) -> Iterator[None]:
        """A cycle that fails before its commit is rolled back: its snapshot may have read its own writes, undone."""
        try:
            yield
        except BaseException:
            self.jobs.forget_reads()
            raise

    def _push_queues(self, db: Session) -> None:
        """A runtime that admits jobs itself gets the platform's queues whenever they change (Kubernetes: as
        Kueue's); a failed push is retried on the next cycle."""
        apply = getattr(self.p.runtime, "apply_queues", None)
        queues = sorted(tenancy.all_queue_configs(db).values(), key=lambda q: q.name)
        pushed = json.dumps([q.model_dump(mode="json") for q in queues], sort_keys=True)
        if apply is None or pushed == self._pushed_queues:
            return
        try:
            apply(queues)
        except Exception as exc:  # the cluster may be unreachable for a while: jobs keep their queue names
            log.warning("could not push the queues to the runtime: %s", exc)
            return
        self._pushed_queues = pushed

    @staticmethod
    def _hand_over(db: Session, now: float) -> Decisions:
        """A runtime that admits jobs itself (Kubernetes: Kueue admits, kube-scheduler places) gets every queued job
        at once (but those held or waiting for a dependency), placed nowhere; while it waits there, its reasons
        come from the runtime (see ``_observe``)."""
        queued = list(db.scalars(select(Job).where(Job.state == JobState.QUEUED.value).order_by(Job.submitted_at)))
        withheld = holds.withhold(db, queued, now)
        return Decisions(starts=[Start(job.id, ()) for job in queued if job.id not in withheld])

    def _checked(self, snap: Snapshot, decisions: Decisions) -> Decisions:
        """The decisions that can be applied: a policy bug must not double-book a GPU or stop a job for nothing."""
        decisions, problems = valid_decisions(snap, decisions)
        for p in problems:
            log.error("policy %s: %s; not applied", getattr(self.policy, "name", "?"), p.message)
        return decisions

    def _observe(self, db: Session, now: float) -> None:
        for job in db.scalars(select(Job).where(Job.state.in_(ACTIVE))):
            if self.launcher.in_flight(job.id, job.attempt):
                continue
            # no handle: the server stopped while this launch was in flight; the runtime finds the job by id
            handle = self._handle(job)
            try:
                runtime = self._runtime_of(job)
                obs = runtime.observe(handle)
                why = (
                    runtime.why_pending(handle)
                    if obs.phase is Phase.STARTING and hasattr(runtime, "why_pending")
                    else None
                )
            except Exception as exc:  # noqa: BLE001 - one unreadable attempt must not stop every other job's cycle
                self._unobservable(db, job, exc, now)
                continue
            self._unobservable_since.pop((job.id, job.attempt), None)
            if why is not None and reasons_changed(job.pending_reasons or [], why):
                job.pending_reasons = why
            if obs.phase is Phase.RUNNING and job.state == JobState.STARTING.value:
                said = {"detail": obs.message} if obs.message else {}  # the runtime's own words, kept as a value
                record(db, job, JobState.RUNNING, "Running", obs.message or "all processes running", now, said)
                notifications.on_running(db, job, self.p.settings.notify_wait_threshold_s, now)
            elif obs.phase in (Phase.SUCCEEDED, Phase.FAILED, Phase.LOST):
                if obs.reason in ("Preempted", "Evicted") and job.stop_requested is None:
                    # the runtime's own admission ended it (Kueue reclaiming quota): requeued like our preemption
                    job.stop_requested = "preempt"
                    job.stop_detail = {"reason": obs.reason, "message": obs.message, "params": {"detail": obs.message}}
                self._finish(db, job, obs.phase, obs.exit_code, obs.reason, obs.message, now)

    def _finish(
        self, db: Session, job: Job, phase: Phase, exit_code: int | None, reason: str, message: str, now: float
    ) -> None:
        if job.started_at is not None:
            job.attained_gpu_s += max(0.0, now - job.started_at) * _gpus(job)
        job.exit_code = exit_code
        job.finished_at = now
        if job.stop_requested == "cancel":
            record(
                db,
                job,
                JobState.CANCELLED,
                "CancelledByUser",
                f"cancelled by {(job.stop_detail or {}).get('by', 'a user')}",
                now,
                {"by": (job.stop_detail or {}).get("by", "?")},
            )
        elif job.stop_requested == STOP:  # governance stopped it: idle GPUs, its runtime limit
            d = job.stop_detail or {}
            record(db, job, JobState.CANCELLED, d.get("reason", "Stopped"), d.get("message", ""), now, d.get("params"))
        elif job.stop_requested == "preempt":
            d = job.stop_detail or {}
            record(
                db, job, JobState.PREEMPTED, d.get("reason", "Preempted"), d.get("message", ""), now, d.get("params")
            )
            record(db, job, JobState.QUEUED, "Requeued", "re-queued after preemption; same working directory", now, {})
            job.queued_at, job.finished_at, job.started_at, job.exit_code = now, None, None, None
            job.allocations, job.handle = [], None
        elif phase is Phase.SUCCEEDED:
            record(db, job, JobState.SUCCEEDED, "Completed", message or "exit code 0", now, {"exit_code": 0})
            self._to_publish |= job_publish.mark_pending(job)
        elif phase is Phase.FAILED:
            exited = {"exit_code": exit_code, "detail": message} if exit_code is not None else {"detail": message}
            record(db, job, JobState.FAILED, reason or "ExitCode", message or f"exit code {exit_code}", now, exited)
        else:
            record(
                db,
                job,
                JobState.LOST,
                reason or "ProcessGone",
                message or "processes vanished",
                now,
                {"detail": message},
            )
        job.stop_requested, job.stop_detail = None, None

    def _profile(self, db: Session, running: list[Job], now: float) -> None:
        """Shareable jobs' first minutes alone, measured as solo records (solo_profiles.py)."""
        if self.profiles is None:
            return
        for job, message, params in self.profiles.cycle(running, self.p.nodes(), now):
            note(db, job, "Profiled", message, params)

    def _charge(
        self, db: Session, now: float, running: list[Job], names: dict[int, str]
    ) -> tuple[dict[str, float], dict[str, float]]:
        """Decay usage and charge what ran since the last cycle, as GPU-seconds per user and per queue."""
        rows = {u.key: u for u in db.scalars(select(Usage))}
        last = self._last_charge or max((u.updated_at for u in rows.values()), default=now)
        elapsed = max(0.0, now - last)
        self._last_charge = now
        values = fairshare.decay({k: u.value for k, u in rows.items()}, elapsed, self.p.settings.fair_share_half_life_s)
        for job in running:
            gs = _gpus(job) * elapsed
            if gs:
                for key in (f"user:{names.get(job.user_id)}", f"queue:{job.queue}"):
                    values[key] = values.get(key, 0.0) + gs
        for key, value in values.items():
            row = rows.get(key)
            if row is None:
                db.add(Usage(key=key, value=value, updated_at=now))
            else:
                row.value, row.updated_at = value, now
        users = {k[5:]: v for k, v in values.items() if k.startswith("user:")}
        queues = {k[6:]: v for k, v in values.items() if k.startswith("queue:")}
        return users, queues

    def _snapshot(
        self, db: Session, now: float, user_usage: dict, queue_usage: dict, names: dict[int, str]
    ) -> Snapshot:
        """The policy's view of the cluster; the queued jobs' side kept between cycles (snapshot_jobs.py)."""
        self.jobs.read(db, now)
        active = list(db.scalars(select(Job).where(Job.state.in_(ACTIVE))))
        keys = self.jobs.learned_keys() | {(job.user_id, job.kind) for job in active}
        learned = expected_runtimes(db, keys)
        cycle = self.jobs.queued(db, names, learned, now)
        self._cycle = cycle
        running_workloads: dict[str, str | None] = {}
        running = []
        for job in active:
            facts = self.jobs.facts(job)
            sj = sched_job(job, facts, names.get(job.user_id, "?"), learned.get((job.user_id, job.kind)), queued=False)
            running_workloads[job.id] = facts.workload
            sj.started_at = job.started_at
            sj.allocations = tuple(_alloc_from_json(a) for a in job.allocations)
            sj.terminating = job.stop_requested is not None
            if job.stop_requested == "preempt":  # its room is promised to the job that preempted it
                sj.preempted_by = (job.stop_detail or {}).get("by")
            if job.started_at is not None:
                sj.attained_gpu_s += (now - job.started_at) * sj.gpus
            running.append(sj)
        snap = Snapshot(
            now=now,
            nodes=cordons.in_service(db, self.p.nodes()),
            queued=cycle.offered,
            running=running,
            queues=tenancy.all_queue_configs(db),
            user_usage=user_usage,
            queue_usage=queue_usage,
            queue_memo=self.jobs.memo,
            queue_changes=cycle.changes,
        )
        if self.predictions is not None:
            workloads = ChainMap(running_workloads, self.jobs.workloads)
            snap.sharing = self.predictions.info(snap, workloads, queued_sharers=cycle.sharers)
        return snap

    def _apply(self, db: Session, decisions: Decisions, now: float) -> None:
        for pre in decisions.preemptions:
            job = db.get(Job, pre.job_id)
            if job is None or job.state not in ACTIVE or job.stop_requested:
                continue
            request_preemption(self.p, db, job, pre.by_job_id, pre.reason, pre.message, now)
        for start in decisions.starts:
            job = db.get(Job, start.job_id)
            if job is None or job.state != JobState.QUEUED.value:
                continue
            self._launch(db, job, start.allocations, now, start.note)
        self._write_reasons(db, decisions)

    def _write_reasons(self, db: Session, decisions: Decisions) -> None:
        """The queued jobs' reasons but their places (kept in memory: queue_positions.py), where what a person
        reads changed. Compared with the reasons this cycle's snapshot read, and written in one statement: a long
        queue's jobs are not read one by one."""
        cycle, self._cycle = self._cycle, None
        stored = cycle.stored_reasons if cycle is not None else {}
        changed = []
        for job_id, reasons in self._specific_reasons(decisions.pending, cycle):
            had = stored.get(job_id)
            if not reasons and had == []:  # most of a long queue: nothing but its place to say
                continue
            payload = [as_stored(r) for r in reasons]
            if had is None:  # not offered by this cycle's snapshot: read it
                job = db.get(Job, job_id)
                if job is not None and job.state == QUEUED and reasons_changed(job.pending_reasons, payload):
                    job.pending_reasons = payload
            elif reasons_changed(had, payload):
                changed.append({"job_id": job_id, "reasons": payload})
        if changed:
            jobs = Job.__table__  # a Core statement: the ORM's bulk form updates by primary key alone
            db.execute(
                update(jobs)
                .where(jobs.c.id == bindparam("job_id"), jobs.c.state == QUEUED)
                .values(pending_reasons=bindparam("reasons")),
                changed,
            )

    @staticmethod
    def _specific_reasons(
        pending: Mapping[str, list[Reason]], cycle: QueuedCycle | None
    ) -> Iterable[tuple[str, Sequence[Reason]]]:
        """The pending jobs' reasons but their places, for every pending job whose stored reasons they may differ
        from: those with some reasons, and those offered with none now whose row stores some. A long queue's other
        jobs (most: nothing but a place to say, nothing stored) are not passed over where the policy's pending
        reasons tell which jobs have reasons (``said_reasons``)."""
        said = said_reasons(pending)
        if said is None or cycle is None:
            return specific_reasons(pending)
        reasons, left_out = said
        not_now = left_out.union(reasons, cycle.withheld)
        return [*reasons.items(), *((job_id, ()) for job_id in cycle.stored_some - not_now)]

    def _launch(self, db: Session, job: Job, allocations: tuple[Allocation, ...], now: float, why: str = "") -> None:
        owner = db.get(User, job.user_id)
        home = self.p.settings.workspaces / owner.username
        try:  # a spec stored before today's rules (ValidationError is a ValueError) fails its job, not the cycle
            spec = JobSpec.model_validate(job.spec)
            run_as = identity.run_as(self.p.settings, db, owner)
            job.workdir = job.workdir or str(workdir_for(home, job.id, spec.workdir, spec.kind.value))
            mounts = files.host_mounts(self.p, db, owner, spec)  # access may have been taken away since submission
        except (identity.IdentityError, ValueError, CalderaError) as exc:
            record(db, job, JobState.FAILED, "LaunchFailed", str(exc), now, {"error": str(exc)})
            job.finished_at = now
            db.commit()
            return
        shared_env, held = gpu_share.for_launch(spec, self.p.nodes(), allocations, self.p.runtime.name)
        job.attempt += 1
        job.runtime = self.p.runtime.name  # this attempt stays with it, whatever the default is after a restart
        job.allocations = [_alloc_to_json(a) for a in allocations]
        job.pending_reasons = []
        job.started_at = now
        where = ", ".join(f"{a.node}[gpus {','.join(map(str, a.gpus)) or '-'}]" for a in allocations) or "the cluster"
        msg = "; ".join(x for x in (f"attempt {job.attempt} on {where}", why, held) if x)
        # parameters only for the plain case: sharing notes and a placement left to the cluster stay English
        placed = {"attempt": job.attempt, "where": where} if allocations and not (why or held) else None
        record(db, job, JobState.STARTING, "Scheduled", msg, now, placed)
        db.commit()  # durable before any process exists
        req = LaunchRequest(
            job_id=job.id,
            attempt=job.attempt,
            spec=spec,
            allocations=allocations,
            workdir=Path(job.workdir),
            env={"CALDERA_ACCOUNT": job.account, "CALDERA_QUEUE": job.queue, **_array_env(job), **shared_env},
            base_url=lab_base_url(job.id),
            run_as=run_as,
            home=home,
            authorized_keys=user_keys.authorized_keys(db, owner.id),
            mounts=mounts,
        )
        self.launcher.submit(req)


def _array_env(job: Job) -> dict[str, str]:
    """A task of a job array learns which one it is, as Slurm's SLURM_ARRAY_TASK_ID and SLURM_ARRAY_JOB_ID say."""
    if job.array_id is None:
        return {}
    return {"CALDERA_ARRAY_ID": job.array_id, "CALDERA_ARRAY_INDEX": str(job.array_index)}


def workdir_for(home: Path, job_id: str, requested: str | None, kind: str = JobKind.BATCH.value) -> Path:
    """Inside the owner's own space: the requested relative path; else a lab opens in the workspace itself (the
    notebooks or files of yesterday's session are there today), and any other job gets a fresh directory of its own."""
    if requested:
        path = Path(os.path.normpath(home / requested))
    else:
        path = home if JobKind(kind).interactive else home / "jobs" / job_id
    if path != home and home not in path.parents:
        raise ValueError(f"working directory {requested!r} leaves your space")
    return path
