"""The live loop's jobs kept between cycles (caldera/server/snapshot_jobs.py) decide what a fresh build decides.

Cycles of the live loop over the fake runtime on a queue that changes as a lab's does: jobs of several users,
sizes and priorities submitted between cycles, jobs finishing and starting, a hold and its release, a dependency,
an array with a limit, a cancel. At every cycle the snapshot the loop built with what it kept is compared with one
built from scratch (value for value), and the policy's decisions with the kept jobs and the queue memo with those
on the fresh snapshot without a memo: starts, preemptions and every queued job's reasons.

The loop reads only the rows written since its last cycle (``jobs.change_seq``, set by triggers: migration 0022),
so the queue is changed by every kind of writer: the API (submit, hold, release, cancel), the ORM, Core ``update``
and ``delete`` statements, the loop itself (starts, preemptions, jobs finishing), and a user's learned run time moved
by a job that succeeded. Without the insert, update or delete trigger, or with the learned run time left out of what
a kept job is built from, the first test fails (each checked by breaking the code).
"""

from __future__ import annotations

import copy
import dataclasses
import threading
import time

import pytest
from sqlalchemy import delete, text, update

from caldera.core.spec import JobSpec
from caldera.core.tenancy import Role
from caldera.db.models import Job, User
from caldera.scheduler import engine
from caldera.scheduler.reasons import specific_reasons
from caldera.server import arrays, holds, snapshot_jobs, tenancy
from caldera.server import jobs as jobs_api
from caldera.server.loop import SchedulerLoop
from caldera.server.platform import Platform
from caldera.server.snapshot_jobs import SnapshotJobs
from caldera.server.tenancy import bootstrap, create_user
from tests.conftest import POSTGRES_URL, _fresh_postgres_db, make_settings
from tests.fake_runtime import FakeRuntime


def _decided(d) -> tuple:
    pending = {jid: [(r.code, r.message, r.details) for r in rs] for jid, rs in d.pending.items()}
    return d.starts, d.preemptions, pending


def _checking(
    loop: SchedulerLoop, compared: list[int], silenced: list[str] | None = None, told: list[int] | None = None
) -> None:
    """Wrap the loop's snapshot: each cycle also builds a fresh one and compares it and its decisions, and the
    reasons the loop compares with the stored ones (only the jobs with some, or with some stored) with every
    pending job's; ``silenced`` gets the jobs that stored reasons and have none now. And the loop's policy: where
    the snapshot says how its queue differs from the one the memo read last, the memo reads the jobs not in that
    one alone (a job taken out, held, put back in its place or rebuilt included), not the queue whole; ``told``
    gets the number of jobs taken out of or put into the queue's middle in those cycles."""
    kept_snapshot, kept_policy = loop._snapshot, loop.policy
    last: list = []  # the queue the loop's memo read last

    def policy(snap):
        if snap.queue_memo is not loop.jobs.memo:  # the fresh snapshot's, or the copy compared below
            return kept_policy(snap)
        memo, changes = snap.queue_memo, snap.queue_changes
        before = memo.jobs_read
        decided = kept_policy(snap)
        if changes is not None and changes.previous is last[0] and told is not None:
            had = set(map(id, last[0]))
            assert memo.jobs_read - before == sum(id(sj) not in had for sj in snap.queued)
            told.append(len(changes.left) + len(changes.joined))
        last[:] = [snap.queued]
        return decided

    def snapshot(db, now, user_usage, queue_usage, names):
        snap = kept_snapshot(db, now, user_usage, queue_usage, names)
        kept, cycle = loop.jobs, loop._cycle
        loop.jobs = SnapshotJobs()
        try:
            fresh = kept_snapshot(db, now, user_usage, queue_usage, names)
            fresh_cycle = loop._cycle
        finally:
            loop.jobs, loop._cycle = kept, cycle
        assert fresh.queued == snap.queued and fresh.running == snap.running and fresh.sharing == snap.sharing
        stored = {sj.id: cycle.stored_reasons[sj.id] for sj in snap.queued}
        assert stored == {sj.id: fresh_cycle.stored_reasons[sj.id] for sj in fresh.queued}
        fresh.queue_memo = None
        with_memo = dataclasses.replace(snap, queue_memo=copy.copy(snap.queue_memo))
        decided = loop.policy(with_memo)
        assert _decided(decided) == _decided(loop.policy(fresh))
        every = {jid: list(r) for jid, r in specific_reasons(decided.pending)}
        compared_now = {jid: list(r) for jid, r in loop._specific_reasons(decided.pending, cycle)}
        assert compared_now == {jid: r for jid, r in every.items() if r or stored[jid]}
        if silenced is not None:
            silenced.extend(jid for jid, r in compared_now.items() if not r)
        compared.append(len(snap.queued))
        return snap

    loop._snapshot, loop.policy = snapshot, policy  # type: ignore[method-assign]


@pytest.mark.parametrize("in_place", [snapshot_jobs._REORDER_IN_PLACE, 0], ids=["in-place", "sorted"])
def test_kept_jobs_decide_as_a_fresh_build(tmp_path, db_url, monkeypatch, in_place) -> None:
    """The queue's order kept changed in place (few changes) and sorted again (many: here, always). Only the first
    jobs of the queue get a specific reason when the policy skips them: those pushed back lose theirs."""
    monkeypatch.setattr(snapshot_jobs, "_REORDER_IN_PLACE", in_place)
    monkeypatch.setattr(engine, "EXPLAIN_HEAD", 12)
    settings = make_settings(tmp_path, db_url, gpus=8, run_jobs_as="server")
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
    silenced: list[str] = []
    told: list[int] = []
    _checking(loop, compared, silenced, told)

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
        shares = {"gpu": 1, "gpu_memory_mib": 4000}  # a job that may share a GPU: in the snapshot's sharing
        shared = JobSpec(name="s", command=["true"], resources=shares, shareable=True, workload="resnet50")
        jobs_api.submit(p, db, db.get(User, user_ids[1]), shared)
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
        admin = db.get(User, admin_id)
        queued = db.query(Job).filter(Job.state == "Queued").order_by(Job.submitted_at).all()
        jobs_api.cancel(p, db, queued[-2], admin)
        for job in queued[:-2]:
            if job.priority == "low":
                job.priority = "normal"  # a row changed while queued (no API does it today): its object is rebuilt
        db.commit()
    loop.tick()
    with p.session() as db:  # writes the ORM does not see: Core statements, a deletion
        queued = db.query(Job).filter(Job.state == "Queued").order_by(Job.submitted_at).all()
        assert len(queued) >= 8
        db.execute(update(Job).where(Job.id == queued[0].id).values(queue="default", attained_gpu_s=5.0))
        db.execute(delete(Job).where(Job.id == queued[1].id))
        db.commit()
    loop.tick()
    with p.session() as db:  # a user's learned run time moves: no queued row of theirs is written
        queued = db.query(Job).filter(Job.state == "Queued").order_by(Job.submitted_at).all()
        done = queued[2]
        others = [j for j in queued[3:] if (j.user_id, j.kind) == (done.user_id, done.kind)]
        assert others, "the user has other queued jobs of that kind"
        done.state, done.started_at, done.finished_at, done.attained_gpu_s = "Succeeded", 0.0, 7000.0, 7000.0 * 4
        db.get(User, user_ids[1]).username = "renamed"  # a user's name changes: no job row is written
        db.commit()
    for _ in range(3):
        loop.tick()
        time.sleep(0.1)
    assert len(compared) == 10 and max(compared) >= 20
    # the memo was told of jobs leaving or joining the queue's middle, and read no more than those and new ones:
    # at every cycle but the first and the one after the two snapshots taken without the policy
    assert len(told) == 6 and sum(told) >= 10, told
    assert silenced, "a job's stored reasons went"
    with p.session() as db:
        assert db.query(Job).filter(Job.state == "Queued", Job.attempt > 0).count(), "a preempted job waits again"
        loop.jobs.read(db, time.time() + snapshot_jobs.FULL_READ_EVERY_S)  # the check's full read
        db.rollback()
    assert loop.jobs.missed == 0


def test_the_full_read_finds_a_write_the_changes_read_missed(tmp_path, db_url) -> None:
    """A write that escapes the triggers (one dropped here) is found by the next full read, which then holds it."""
    settings = make_settings(tmp_path, db_url, gpus=1, run_jobs_as="server")
    p = Platform.create(settings, runtime=FakeRuntime(settings))
    with p.session() as db:
        bootstrap(db, "admin-password")
        user = create_user(db, "u0", "password-1234", Role.USER)
        spec = JobSpec(name="j", command=["sleep", "100"], resources={"gpu": 1})
        ids = [jobs_api.submit(p, db, user, spec).id for _ in range(3)]
        db.commit()
    kept = SnapshotJobs()
    with p.session() as db:
        kept.read(db, 0.0)
        sqlite = db.get_bind().dialect.name == "sqlite"
        db.execute(
            text("DROP TRIGGER jobs_change_seq_update" if sqlite else "DROP TRIGGER jobs_change_seq_write ON jobs")
        )
        db.execute(update(Job).where(Job.id == ids[1]).values(priority="high"))
        db.commit()
        kept.read(db, 1.0)
        assert [r[5] for r in kept.rows()] == ["normal"] * 3, "missed by the changes read"
        kept.read(db, 1.0 + snapshot_jobs.FULL_READ_EVERY_S)
        rows = kept.rows()
        assert kept.missed == 1 and [r[5] for r in rows] == ["normal", "high", "normal"]


def _two_queued_jobs(settings) -> tuple[Platform, str, str]:
    """A platform with one user's two queued one-GPU jobs, and their ids."""
    p = Platform.create(settings, runtime=FakeRuntime(settings))
    with p.session() as db:
        bootstrap(db, "admin-password")
        user = create_user(db, "u0", "password-1234", Role.USER)
        spec = JobSpec(name="j", command=["sleep", "100"], resources={"gpu": 1})
        x, y = (jobs_api.submit(p, db, user, spec).id for _ in range(2))
        db.commit()
    return p, x, y


def test_a_write_committed_after_a_read_is_read_next(tmp_path, db_url) -> None:
    """A job written before a read and committed after it is read at the next read. On PostgreSQL change_seq is the
    writing transaction's id, and here a later transaction (a higher id) commits first and is read first: a read
    from the highest value it has seen on would skip the earlier one's write for good."""
    settings = make_settings(tmp_path, db_url, gpus=1, run_jobs_as="server")
    p, x, y = _two_queued_jobs(settings)
    kept = SnapshotJobs()

    def priorities(now: float) -> dict[str, str]:
        with p.session() as db:
            kept.read(db, now)
            rows = kept.rows()
            db.rollback()
        return {row[0]: row[5] for row in rows}

    priorities(0.0)
    postgres = p.engine.dialect.name == "postgresql"
    with p.engine.connect() as early:
        early.execute(update(Job).where(Job.id == x).values(priority="high"))
        if postgres:  # on SQLite the first writer holds the database's write lock until it ends
            with p.engine.begin() as later:
                later.execute(update(Job).where(Job.id == y).values(priority="low"))
        assert priorities(1.0) == {x: "normal", y: "low" if postgres else "normal"}
        early.commit()
    assert priorities(2.0) == {x: "high", y: "low" if postgres else "normal"}
    assert priorities(3.0) == priorities(3.0 + snapshot_jobs.FULL_READ_EVERY_S) and kept.missed == 0


def test_a_cycle_rolled_back_reads_every_row_again(tmp_path, db_url) -> None:
    """A cycle that fails has its writes undone (on SQLite counter values included, which later writes then take
    again; on PostgreSQL the rows go back to values below the mark): the loop must not trust what it read of its own
    undone writes."""
    settings = make_settings(tmp_path, db_url, gpus=1, run_jobs_as="server")
    p = Platform.create(settings, runtime=FakeRuntime(settings))
    with p.session() as db:
        bootstrap(db, "admin-password")
        user = create_user(db, "u0", "password-1234", Role.USER)
        spec = JobSpec(name="j", command=["sleep", "100"], resources={"gpu": 1})  # the first runs, the rest wait
        ids = [jobs_api.submit(p, db, user, spec).id for _ in range(4)]
        db.commit()
    loop = SchedulerLoop(p)
    try:
        compared: list[int] = []
        _checking(loop, compared)
        loop.tick()
        profile, policy = loop._profile, loop.policy

        def writing_profile(db, *args):  # a write of the cycle itself before its snapshot, read by it
            db.execute(update(Job).where(Job.id == ids[2]).values(priority="high"))
            return profile(db, *args)

        def failing_policy(snap):
            raise RuntimeError("a bad cycle")

        loop._profile, loop.policy = writing_profile, failing_policy  # type: ignore[method-assign]
        with pytest.raises(RuntimeError):
            loop.tick()
        loop._profile, loop.policy = profile, policy  # type: ignore[method-assign]
        with p.session() as db:  # takes the counter value the undone write had
            db.execute(update(Job).where(Job.id == ids[3]).values(priority="low"))
            db.commit()
        loop.tick()
        assert len(compared) == 2  # the first cycle and the last: the failed one stopped at its policy
    finally:
        loop.launcher.shutdown()


def test_a_cancel_and_a_cycle_writing_the_same_jobs_do_not_deadlock(tmp_path) -> None:
    """A cycle that has written job Y and then writes job X, while a cancel has written X and not yet committed:
    the cycle waits for the cancel, which ends. A lock taken at each transaction's first job write after the job's
    row lock (the counter row of migration 0022 on PostgreSQL, before this was fixed) made the cancel wait for the
    cycle too: a deadlock, one of them aborted by PostgreSQL."""
    if not POSTGRES_URL:
        pytest.skip("CALDERA_TEST_POSTGRES_URL not set")
    settings = make_settings(tmp_path, _fresh_postgres_db(), gpus=1, run_jobs_as="server")
    p, x, y = _two_queued_jobs(settings)
    errors: list[BaseException] = []
    cancel_pid: list[int] = []
    cancel_wrote, cancel_ends = threading.Event(), threading.Event()

    def cancel() -> None:
        with p.engine.connect() as conn:
            try:
                conn.execute(text("SET lock_timeout = '20s'"))
                cancel_pid.append(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
                conn.execute(update(Job).where(Job.id == x).values(state="Cancelled"))
                cancel_wrote.set()
                cancel_ends.wait(20)
                conn.commit()
            except Exception as e:
                errors.append(e)

    def cycle_writes_x() -> None:
        try:
            cycle.execute(update(Job).where(Job.id == x).values(priority="low"))
            cycle.commit()
        except Exception as e:
            errors.append(e)

    with p.engine.connect() as cycle, p.engine.execution_options(isolation_level="AUTOCOMMIT").connect() as watch:
        cycle.execute(text("SET lock_timeout = '20s'"))
        cycle_pid = cycle.execute(text("SELECT pg_backend_pid()")).scalar_one()
        cycle.execute(update(Job).where(Job.id == y).values(priority="high"))
        canceller = threading.Thread(target=cancel)
        canceller.start()
        # the cancel holds X's row: its UPDATE has returned, or (before the fix) waits for a lock
        _until(lambda: cancel_wrote.is_set() or bool(cancel_pid) and _waits(watch, cancel_pid[0]), canceller)
        writer = threading.Thread(target=cycle_writes_x)
        writer.start()
        _until(lambda: _waits(watch, cycle_pid), writer)  # the cycle waits for X's row (before the fix: deadlock)
        cancel_ends.set()
        canceller.join(30)
        writer.join(30)
    assert errors == []
    with p.session() as db:
        assert (db.get(Job, x).state, db.get(Job, x).priority, db.get(Job, y).priority) == ("Cancelled", "low", "high")


def _waits(watch, pid: int) -> bool:
    """Whether the PostgreSQL backend ``pid`` waits for a lock."""
    query = text("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = :pid")
    return bool(watch.execute(query, {"pid": pid}).scalar_one())


def _until(condition, thread: threading.Thread) -> None:
    deadline = time.monotonic() + 10
    while thread.is_alive() and not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
