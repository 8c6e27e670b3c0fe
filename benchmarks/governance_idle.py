"""GPU-hours reclaimed by idle stopping on a simulated lab month, per idle window (docs/governance.md).

    python benchmarks/governance_idle.py [--users 40] [--days 30] [--seed 7] [--windows 0.5,1,2,4,8] [--grace 1]

Public cluster traces carry no per-job GPU utilisation, so the workload is generated here (``lab_month``): each
user opens interactive sessions on working days (1 GPU mostly, 2 or 4 sometimes); a session alternates work
phases (20-120 min at 30-95%) with think-time pauses (GPU at 0-2% for 5-60 min, sometimes a 1-3 h lunch or meeting),
then its user stops working and the session is either closed at once (50%), left open for 2-14 hours, until the
evening or the next morning (40%), or left for 1-3 days (10%). Samples every 5 minutes. Each session is replayed
through the platform's own decision (``caldera.governance.decide.idle``, checked every 15 minutes) with the queue's
threshold (5%) and the given grace period, for each idle window. Reported per window: GPU-hours allocated, reclaimed
(stopped before the user closed it), mean utilisation of the allocated GPU-hours before and after, and the sessions
stopped while their user would have come back to work (the cost side). Deterministic for a seed; CPU only.
"""

from __future__ import annotations

import argparse
import random
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from caldera.core.governance import IdleRule  # noqa: E402
from caldera.governance.decide import Action, JobFacts, idle  # noqa: E402

STEP_S = 300.0  # one sample every 5 minutes
CHECK_S = 900.0  # the governor looks every 15 minutes (the platform's default is every minute)
HOUR, DAY = 3600.0, 86400.0


@dataclass
class Session:
    start: float
    gpus: int
    util: list[float]  # one sample per STEP_S from start
    last_work: float  # when its user last used it (after this it is left open)

    @property
    def end(self) -> float:
        return self.start + len(self.util) * STEP_S


def _session(rng: random.Random, start: float) -> Session:
    gpus = rng.choices((1, 2, 4), (0.8, 0.15, 0.05))[0]
    util: list[float] = []
    worked = rng.uniform(1, 6) * HOUR
    t = 0.0
    while t < worked:
        for _ in range(int(rng.uniform(20, 120) * 60 / STEP_S) or 1):  # a work phase
            util.append(rng.uniform(30, 95))
        pause = rng.uniform(1, 3) * HOUR if rng.random() < 0.15 else rng.uniform(5, 60) * 60
        for _ in range(int(pause / STEP_S)):
            util.append(rng.uniform(0, 2))
        t = len(util) * STEP_S
    last_work = start + max(i for i, u in enumerate(util) if u >= 30) * STEP_S
    while util and util[-1] < 30:  # the pause after the last work phase is the start of the tail
        util.pop()
    fate = rng.random()
    tail = 0.0 if fate < 0.5 else rng.uniform(2, 14) * HOUR if fate < 0.9 else rng.uniform(1, 3) * DAY
    util.extend(rng.uniform(0, 2) for _ in range(int(tail / STEP_S)))
    return Session(start, gpus, util, last_work)


def lab_month(users: int, days: int, seed: int) -> list[Session]:
    rng = random.Random(seed)
    out = []
    for _ in range(users):
        for day in range(days):
            if day % 7 in (5, 6) or rng.random() < 0.3:  # weekends off, and not every working day
                continue
            for _ in range(rng.choices((1, 2), (0.8, 0.2))[0]):
                out.append(_session(rng, day * DAY + rng.uniform(8.5, 15) * HOUR))
    return out


def stop_time(s: Session, rule: IdleRule, gap_s: float) -> float | None:
    """When the platform would stop ``s`` (None: never), replaying its samples through the real decision."""
    samples = [(s.start + i * STEP_S, u) for i, u in enumerate(s.util)]
    warned = None
    t = s.start + CHECK_S
    while t < s.end:
        lo = bisect_left(samples, t - rule.window_s - rule.grace_s - STEP_S)
        hi = bisect_left(samples, t + 1)
        series = {f"g{i}": samples[lo:hi] for i in range(s.gpus)}
        v = idle(JobFacts("s", "jupyter", s.gpus, s.start, idle_warned_at=warned), rule, series, t, gap_s)
        if v.action is Action.WARN:
            warned = t
        elif v.action is Action.CLEAR:
            warned = None
        elif v.action is Action.STOP:
            return t
        t += CHECK_S
    return None


def bisect_left(samples: list[tuple[float, float]], at: float) -> int:
    lo, hi = 0, len(samples)
    while lo < hi:
        mid = (lo + hi) // 2
        if samples[mid][0] < at:
            lo = mid + 1
        else:
            hi = mid
    return lo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--users", type=int, default=40)
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--windows", default="0.5,1,2,4,8", help="idle windows to compare, in hours")
    ap.add_argument("--grace", type=float, default=1.0, help="grace period after the warning, in hours")
    args = ap.parse_args()
    sessions = lab_month(args.users, args.days, args.seed)
    allocated = sum(len(s.util) * STEP_S * s.gpus for s in sessions) / HOUR
    busy = sum(sum(s.util) / 100 * STEP_S * s.gpus for s in sessions) / HOUR
    print(f"{len(sessions)} sessions of {args.users} users over {args.days} days; {allocated:.0f} GPU-hours "
          f"allocated, mean utilisation {100 * busy / allocated:.0f}% without idle stopping\n")  # fmt: skip
    print("| idle window | grace | GPU-hours reclaimed | share of allocated | utilisation after | sessions stopped "
          "| stopped while the user would have come back |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for window in (float(w) for w in args.windows.split(",")):
        rule = IdleRule(threshold_percent=5, window_s=int(window * HOUR), grace_s=int(args.grace * HOUR))
        reclaimed, stopped, early = 0.0, 0, 0
        for s in sessions:
            at = stop_time(s, rule, gap_s=2 * STEP_S)
            if at is None:
                continue
            stopped += 1
            reclaimed += (s.end - at) * s.gpus / HOUR
            early += at < s.last_work
        after = allocated - reclaimed
        print(f"| {window:g} h | {args.grace:g} h | {reclaimed:.0f} | {100 * reclaimed / allocated:.0f}% "
              f"| {100 * busy / after:.0f}% | {stopped} | {early} |")  # fmt: skip


if __name__ == "__main__":
    main()
