"""A server restart with N running jobs: time to re-attach, jobs lost, devices double-booked.

    python benchmarks/restart.py [--jobs 20] [--runtimes local,container,local>container]

For each case, one platform (the live loop's code, SQLite in a throw-away data directory, N fake GPUs) starts N
one-GPU jobs that run ``sleep`` and waits until all run; then the server is dropped without stopping anything and a
new platform on the same data directory re-attaches (``SchedulerLoop.recover``, timed). ``a>b``: the first server ran
runtime a, the restarted one runtime b (the default changed, e.g. podman became usable). Afterwards N more one-GPU
jobs are submitted and cycles run for a few seconds: since every GPU is held, none may start (a start would be a
device handed out twice). Needs root; the container cases need podman and the base image.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from caldera.config import FakeGpu, Settings  # noqa: E402
from caldera.core.spec import JobSpec  # noqa: E402
from caldera.db.models import Job, User  # noqa: E402
from caldera.server import jobs as jobs_api  # noqa: E402
from caldera.server.loop import SchedulerLoop  # noqa: E402
from caldera.server.platform import Platform  # noqa: E402
from caldera.server.tenancy import bootstrap  # noqa: E402


def _platform(settings: Settings, runtime: str) -> tuple[Platform, SchedulerLoop]:
    p = Platform.create(settings.model_copy(update={"runtime": runtime}))
    with p.session() as db:
        bootstrap(db, "admin-password")
        db.commit()
    return p, SchedulerLoop(p)


def _submit(p: Platform, n: int, prefix: str) -> list[str]:
    with p.session() as db:
        admin = db.query(User).filter_by(username="admin").one()
        ids = [
            jobs_api.submit(
                p, db, admin, JobSpec(name=f"{prefix}{i}", command=["sleep", "600"], resources={"gpu": 1})
            ).id
            for i in range(n)
        ]
        db.commit()
    return ids


def _states(p: Platform, ids: list[str]) -> dict[str, int]:
    with p.session() as db:
        out: dict[str, int] = {}
        for jid in ids:
            state = db.get(Job, jid).state
            out[state] = out.get(state, 0) + 1
        return out


def _until_running(p: Platform, loop: SchedulerLoop, ids: list[str], timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while _states(p, ids).get("Running", 0) < len(ids):
        if time.time() > deadline:
            raise SystemExit(f"not all running after {timeout} s: {_states(p, ids)}")
        loop.tick()
        time.sleep(0.2)


def case(first: str, second: str, n: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="caldera-restart-") as tmp:
        settings = Settings(
            data_dir=Path(tmp) / "data",
            fake_gpus=[FakeGpu(model="a100")] * n,
            node_name="node-0",
            node_cpu=4 * n,
            node_memory_mib=1024 * n,
            run_jobs_as="server",
            cancel_grace_s=1,
        )
        p, loop = _platform(settings, first)
        ids = _submit(p, n, "run")
        _until_running(p, loop, ids)
        loop.launcher.shutdown()
        p.engine.dispose()  # the server is gone; its jobs are not

        p, loop = _platform(settings, second)
        t0 = time.perf_counter()
        loop.recover()
        reattach_s = time.perf_counter() - t0
        after = _states(p, ids)
        waiting = _submit(p, n, "wait")
        for _ in range(10):
            loop.tick()
            time.sleep(0.2)
        started_twice = sum(1 for s in ("Starting", "Running") for _ in range(_states(p, waiting).get(s, 0)))
        with p.session() as db:
            held = [(a["node"], g) for jid in ids for a in db.get(Job, jid).allocations for g in a["gpus"]]
            admin = db.query(User).filter_by(username="admin").one()
            for jid in ids + waiting:
                jobs_api.cancel(p, db, db.get(Job, jid), admin)
            db.commit()
        for _ in range(30):
            loop.tick()
            if not _states(p, ids).get("Running"):
                break
            time.sleep(0.5)
        loop.launcher.shutdown()
        return {
            "case": f"{first} -> {second}",
            "jobs": n,
            "reattach_s": reattach_s,
            "lost": n - after.get("Running", 0),
            "double_booked": started_twice + (len(held) - len(set(held))),
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=20)
    ap.add_argument("--runtimes", default="local,container,local>container,container>local")
    args = ap.parse_args()
    print("| restart | running jobs | re-attach | jobs lost | devices double-booked |")
    print("|---|---:|---:|---:|---:|")
    for spec in args.runtimes.split(","):
        first, _, second = spec.partition(">")
        r = case(first, second or first, args.jobs)
        print(
            f"| {r['case']} | {r['jobs']} | {r['reattach_s']:.2f} s | {r['lost']} | {r['double_booked']} |", flush=True
        )


if __name__ == "__main__":
    main()
