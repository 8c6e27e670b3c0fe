"""Every README figure a scheduling-policy change can move, rerun by one command before such a change lands.

    nice -n 10 python benchmarks/policy_figures.py [OUT_DIR] [--quick]

Runs, one after the other, with the date and time (UTC) each started and how long it took:

* ``bench_schedule.py``: the cycle table (README "Benchmarks", scheduling cycle), with its calibration loop;
* ``sim_quality.py OUT_DIR/quality --restart-overhead 300``: the eight-case table of README "Scheduling quality"
  (average / p99 JCT, makespan, GPU allocation, preemptions and the most of one job, per policy, and the issue-30
  criteria each caldera row misses);
* ``idle_capacity.py``: where idle GPUs go while jobs wait on Alibaba 2 x 8 (docs/scheduler-efficiency.md);
* ``bench_sim.py OUT_DIR/philly``: the whole Philly replay (README "Benchmarks", trace replay); left out with
  ``--quick`` (it takes hours on the 2-core VM).

Each script prints its own table; this one only runs them, so that the docs can say when every figure was measured
(the README quotes the dates printed here). Exits with the first non-zero exit status of a script, else 0.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent


def steps(out: Path, quick: bool) -> list[list[str]]:
    runs = [
        ["bench_schedule.py"],
        ["sim_quality.py", str(out / "quality"), "--restart-overhead", "300"],
        ["idle_capacity.py", "--trace", "alibaba", "--cluster", "2x8:v100", "--restart-overhead", "300"],
    ]
    if not quick:
        runs.append(["bench_sim.py", str(out / "philly")])
    return runs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", nargs="?", type=Path, default=Path("out/policy_figures"))
    ap.add_argument("--quick", action="store_true", help="leave out the whole Philly replay")
    args = ap.parse_args(argv)
    status = 0
    for script, *rest in steps(args.out, args.quick):
        started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        print(f"=== {script} {' '.join(rest)} (measured {started})", flush=True)
        t0 = time.monotonic()
        rc = subprocess.call([sys.executable, str(HERE / script), *rest])
        print(f"=== {script}: exit {rc}, {time.monotonic() - t0:.0f} s", flush=True)
        status = status or rc
    return status


if __name__ == "__main__":
    sys.exit(main())
