"""The live loop's jobs kept between cycles (caldera/server/snapshot_jobs.py) decide what a fresh build decides.

Cycles of the live loop over the fake runtime on a queue that changes as a lab's does: jobs of several users,
sizes and priorities submitted between cycles, jobs finishing and starting, a hold and its release, a dependency,
an array with a limit, a cancel. At every cycle the snapshot the loop built with what it kept is compared with one
built from scratch (value for value), and the policy's decisions with the kept jobs and the queue memo with those
on the fresh snapshot without a memo: starts, preemptions and every queued job's reasons.
"""

from __future__ import annotations

import copy
import dataclasses
import time

from caldera.core.spec import JobSpec
from caldera.core.tenancy import Role
from caldera.db.models import Job, User
from caldera.server import arrays, holds, tenancy
from caldera.server import jobs as jobs_api
from caldera.server.loop import SchedulerLoop
from caldera.server.platform import Platform
from caldera.server.snapshot_jobs import SnapshotJobs
from caldera.server.tenancy import bootstrap, create_user
from tests.conftest import make_settings
from tests.fake_runtime import FakeRuntime


def _decided(d) -> tuple:
    pending = {jid: [(r.code, r.message, r.details) for r in rs] for jid, rs in d.pending.items()}
    return d.starts, d.preemptions, pending


def _checking(loop: SchedulerLoop, compared: list[int]) -> None:
    """Wrap the loop's snapshot: each cycle also builds a fresh one and compares it and its decisions."""
    kept_snapshot = loop._snapshot

    def snapshot(db, now, user_usage, queue_usage, names):
        snap = kept_snapshot(db, now, user_usage, queue_usage, names)
        kept, cycle = loop.jobs, loop._cycle
        loop.jobs = SnapshotJobs()
        try:
            fresh = kept_snapshot(db, now, user_usage, queue_usage, names)
        finally:
            loop.jobs, loop._cycle = kept, cycle
        assert fresh.queued == snap.queued and fresh.running == snap.running
        fresh.queue_memo = None
        with_memo = dataclasses.replace(snap, queue_memo=copy.copy(snap.queue_memo))
        assert _decided(loop.policy(with_memo)) == _decided(loop.policy(fresh))
        compared.append(len(snap.queued))
        return snap

    loop._snapshot = snapshot  # type: ignore[method-assign]


def test_kept_jobs_decide_as_a_fresh_build(tmp_path) -> None:
    settings = make_settings(tmp_path, f"sqlite:///{tmp_path / 'caldera.db'}", gpus=8, run_jobs_as="server")
    p = Platform.create(settings, runtime=FakeRuntime(settings))
    with p.session() as db:
        bootstrap(db, "admin-password")
        user_ids = [create_user(db, f"u{i}", "password-1234", Role.USER).id for i in range(3)]
        admin_id = db.query(User).filter_by(username="admin").one().id
        db.commit()
    loop = SchedulerLoop(p)
    try:
        _cycles(p, loop, user_ids, admin_id)
    finally:
        loop.launcher.shutdown()


def _cycles(p: Platform, loop: SchedulerLoop, user_ids: list[int], admin_id: int) -> None:
    compared: list[int] = []
    _checking(loop, compared)

    def submit(n: int, at: int, by: list[int], priorities: tuple[str, ...], run_s: float) -> list[str]:
        with p.session() as db:
            ids = []
            for i in range(at, at + n):
                run = ["sleep", str(run_s)]
                gpus, priority = (1, 2, 1, 4)[i % 4], priorities[i % len(priorities)]
                spec = JobSpec(name=f"j{i}", command=run, resources={"gpu": gpus}, priority=priority)
                ids.append(jobs_api.submit(p, db, db.get(User, by[i % len(by)]), spec).id)
            db.commit()
            return ids

    first = submit(24, 0, user_ids, ("normal", "normal", "low", "best-effort"), 1000)  # the GPUs stay busy
    loop.tick()
    with p.session() as db:
        owner = db.get(User, user_ids[0])
        holds.hold(db, db.get(Job, first[-1]), db.get(User, admin_id), "later")
        dependent = JobSpec(name="after", command=["true"], resources={"gpu": 1}, after=[{"job": first[0]}])
        jobs_api.submit(p, db, owner, dependent)
        arrays.submit(p, db, owner, JobSpec(name="arr", command=["sleep", "0.2"], resources={"gpu": 1}), "0-5%2")
        db.commit()
    loop.tick()
    with p.session() as db:  # a row that did not change keeps its object
        again = [loop._snapshot(db, time.time(), {}, {}, tenancy.usernames(db)).queued for _ in range(2)]
        assert len(again[0]) > 10 and all(a is b for a, b in zip(*again, strict=True))
        db.rollback()
    submit(6, 100, [admin_id], ("high",), 0.2)  # preempts: the victims are queued again, changed
    loop.tick()
    with p.session() as db:
        holds.release(db, db.get(Job, first[-1]), db.get(User, admin_id))
        gone = db.get(Job, first[-2])
        if gone.state == "Queued":  # as a cancel leaves it
            gone.state, gone.finished_at = "Cancelled", gone.submitted_at
        for job in db.query(Job).filter(Job.state == "Queued", Job.priority == "low"):
            job.priority = "normal"  # a row changed while queued (no API does it today): its object is rebuilt
        db.commit()
    for _ in range(5):
        loop.tick()
        time.sleep(0.1)
    assert len(compared) == 10 and max(compared) >= 20
    with p.session() as db:
        assert db.query(Job).filter(Job.state == "Queued", Job.attempt > 0).count(), "a preempted job waits again"
