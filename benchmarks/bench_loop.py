"""The live loop's cycle (``SchedulerLoop.tick``) at a long queue: database to snapshot, the policy, its decisions.

    python benchmarks/bench_loop.py [--queued 10000] [--gpus 64] [--cycles 9] [--churn 0] [--requeued 0]
                                    [--profile OUT.prof]

One platform (the live loop's code, SQLite in a throw-away data directory, the in-memory fake runtime of the tests:
no process is started) with ``--gpus`` fake GPUs on one node and ``--queued`` queued jobs of a few users and sizes,
written straight into the database (submitting 100,000 jobs through the API would take longer than the bench).
The first cycles fill the GPUs with jobs that run for days; then ``--cycles`` cycles are timed, each with the jobs
queued unchanged, as a busy cluster's cycles mostly are, or with ``--churn N``: before each timed cycle N queued
jobs spread over the queue are cancelled and N new ones submitted (written straight into the database, not timed);
with ``--requeued N``, N queued jobs spread over the queue are written as a preempted job re-queued in its place is
(one more attempt, more attained service): each leaves its place and comes back to it.
Prints the median and the range of the cycle's wall and CPU
time and, per part, where its wall time went: the snapshot built from the database (``_snapshot``), the policy,
the queued jobs' reasons compared and written (``_write_reasons``); the rest of the tick is observing, charging
usage and starting jobs; and how many job objects the policy's queue memo read per timed cycle (the queue's length
when it reads the queue whole). ``--profile`` writes cProfile's statistics of the timed cycles. Exits 0.
"""

from __future__ import annotations

import argparse
import cProfile
import statistics
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import select, update

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from caldera.config import FakeGpu, Settings  # noqa: E402
from caldera.core.spec import JobSpec  # noqa: E402
from caldera.core.tenancy import Role  # noqa: E402
from caldera.db.models import Job  # noqa: E402
from caldera.server.loop import SchedulerLoop  # noqa: E402
from caldera.server.platform import Platform  # noqa: E402
from caldera.server.tenancy import bootstrap, create_user  # noqa: E402
from tests.fake_runtime import FakeRuntime  # noqa: E402

USERS = 20
SIZES = (1, 1, 1, 2, 4, 8)  # GPUs per job, cycled


def _queued_job(job_id: str, spec: dict, user_id: int, at: float) -> Job:
    """A queued job's row as a submission writes it, written straight into the database."""
    return Job(
        id=job_id,
        name=spec["name"],
        user_id=user_id,
        account="default",
        queue="default",
        kind=spec["kind"],
        priority=spec["priority"],
        spec=spec,
        state="Queued",
        submitted_at=at,
        queued_at=at,
        attempt=0,
        allocations=[],
        pending_reasons=[],
    )


def platform(data: Path, gpus: int, queued: int) -> tuple[Platform, SchedulerLoop]:
    settings = Settings(
        data_dir=data,
        fake_gpus=[FakeGpu(model="a100")] * gpus,
        node_name="node-0",
        node_cpu=4 * gpus,
        node_memory_mib=65536 * gpus,
        run_jobs_as="server",
    )
    p = Platform.create(settings, runtime=FakeRuntime(settings))
    with p.session() as db:
        bootstrap(db, "admin-password")
        users = [create_user(db, f"user{i}", "password-1234", Role.USER) for i in range(USERS)]
        db.flush()
        specs = [
            JobSpec(name=f"j{g}", command=["sleep", "1000000"], resources={"gpu": g}).model_dump(mode="json")
            for g in SIZES
        ]
        t0 = time.time() - queued
        for i in range(queued):
            spec = specs[i % len(specs)]
            db.add(_queued_job(f"b{i:09d}", spec, users[i % USERS].id, t0 + i))
        db.commit()
    return p, SchedulerLoop(p)


def churn(p: Platform, n: int, cycle: int) -> None:
    """``n`` queued jobs spread over the queue cancelled and ``n`` new ones submitted, as between two cycles of a
    busy lab."""
    with p.session() as db:
        queued = db.scalars(select(Job.id).where(Job.state == "Queued").order_by(Job.submitted_at)).all()
        gone = [queued[i * len(queued) // n] for i in range(n)]
        db.execute(update(Job).where(Job.id.in_(gone)).values(state="Cancelled", finished_at=time.time()))
        template = db.get(Job, queued[-1])
        for k in range(n):
            db.add(_queued_job(f"c{cycle:04d}{k:05d}", template.spec, template.user_id, time.time()))
        db.commit()


def requeue(p: Platform, n: int) -> None:
    """``n`` queued jobs spread over the queue written as preempted jobs re-queued in their places are."""
    with p.session() as db:
        queued = db.scalars(select(Job.id).where(Job.state == "Queued").order_by(Job.submitted_at)).all()
        back = [queued[i * len(queued) // n + 1] for i in range(n)]
        values = {"attempt": Job.attempt + 1, "attained_gpu_s": Job.attained_gpu_s + 3600.0}
        db.execute(update(Job).where(Job.id.in_(back)).values(**values))
        db.commit()


def timed(
    p: Platform, loop: SchedulerLoop, cycles: int, churned: int, requeued: int, profile: str | None
) -> dict[str, list[float]]:
    """Ms per cycle: the whole tick (wall and CPU time: CPU time drifts less on a shared machine), and its parts
    (wall; the methods wrapped to time them): the snapshot, the policy, the reasons written."""
    parts: dict[str, list[float]] = {"snapshot": [], "policy": [], "reasons": []}
    write_reasons = getattr(loop, "_write_reasons", None)

    def timed_reasons(*a, **kw):
        t = time.perf_counter()
        write_reasons(*a, **kw)
        parts["reasons"].append((time.perf_counter() - t) * 1000)

    snapshot, policy = loop._snapshot, loop.policy

    def timed_snapshot(*a, **kw):
        t = time.perf_counter()
        out = snapshot(*a, **kw)
        parts["snapshot"].append((time.perf_counter() - t) * 1000)
        return out

    def timed_policy(snap):
        t = time.perf_counter()
        out = policy(snap)
        parts["policy"].append((time.perf_counter() - t) * 1000)
        return out

    loop._snapshot, loop.policy = timed_snapshot, timed_policy  # type: ignore[method-assign]
    if hasattr(loop, "_write_reasons"):  # not in the code before the loop kept its jobs (to time that too)
        loop._write_reasons = timed_reasons  # type: ignore[method-assign]
    prof = cProfile.Profile() if profile else None
    ticks, cpu = [], []
    for cycle in range(cycles):
        if churned:
            churn(p, churned, cycle)
        if requeued:
            requeue(p, requeued)
        t, c = time.perf_counter(), time.process_time()
        if prof:
            prof.enable()
        loop.tick()
        if prof:
            prof.disable()
        ticks.append((time.perf_counter() - t) * 1000)
        cpu.append((time.process_time() - c) * 1000)
    if prof and profile:
        prof.dump_stats(profile)
    return {"tick": ticks, "tick CPU": cpu, **parts}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queued", type=int, default=10_000)
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--cycles", type=int, default=9)
    ap.add_argument("--churn", type=int, default=0, help="queued jobs cancelled and submitted before each cycle")
    ap.add_argument("--requeued", type=int, default=0, help="queued jobs re-queued in their places before each cycle")
    ap.add_argument("--profile", help="write cProfile statistics of the timed cycles here")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        p, loop = platform(Path(tmp), a.gpus, a.queued)
        print(f"{a.queued:,} queued jobs written in {time.perf_counter() - t:.1f} s; {a.gpus} GPUs")
        for _ in range(3):  # the GPUs filled, every queued job's reasons written once
            loop.tick()
            time.sleep(0.05)
        with p.session() as db:
            running = db.query(Job).filter(Job.state.in_(("Starting", "Running"))).count()
        memo = loop.jobs.memo
        read_before = memo.jobs_read
        out = timed(p, loop, a.cycles, a.churn, a.requeued, a.profile)
        read = (memo.jobs_read - read_before) / a.cycles
        loop.launcher.shutdown()
    print(
        f"{running} jobs running; {a.cycles} cycles timed, {a.churn} jobs cancelled and submitted and {a.requeued} "
        "re-queued before each"
    )
    print(f"the queue memo read {read:,.0f} job objects per timed cycle")
    for name, ms in out.items():
        if ms:
            print(f"{name:>9}: median {statistics.median(ms):8.1f} ms  (min {min(ms):.1f}, max {max(ms):.1f})")


if __name__ == "__main__":
    main()
    sys.exit(0)
