"""Replay the whole Philly trace (82,247 jobs, 109 days) under each policy and compare them.

    python benchmarks/bench_sim.py [OUT_DIR] [--nodes 80] [--gpus-per-node 8] [--policies fifo,tiresias,caldera]
                                   [--limit N] [--tick 60] [--no-wake-hints] [--cycle-quantum 0] [--traces-dir DIR]

The default cluster is 80 nodes x 8 V100s = 640 GPUs. Run with every job starting at its submission, the trace keeps
a median of 422 GPUs busy (90th percentile 709, peak 1,154; mean demand 374 GPUs over the 109 days), so 640 GPUs
is enough for the everyday load while queues build up in the busy weeks (days 18-55), and the policies differ.
Prints the load time, the wall time of each policy's replay and a comparison table (average JCT, p99 queueing
delay, Jain's fairness index over accounts' mean slowdown, preemptions), and writes ``results.json`` and
``comparison.png`` to OUT_DIR (default ``out/bench``). Exits 1 if a policy's replay took over 5 minutes.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from caldera.sim.cli import fmt_s, run_sim  # noqa: E402

BUDGET_S = 300.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", default="out/bench", help="output directory (default out/bench)")
    ap.add_argument("--nodes", type=int, default=80)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--gpu-model", default="v100")
    ap.add_argument("--policies", default="fifo,tiresias,caldera")
    ap.add_argument("--limit", type=int, default=None, help="only the first N jobs (default: all)")
    ap.add_argument("--tick", type=float, default=60.0, help="periodic cycle while jobs wait (simulated s)")
    ap.add_argument(
        "--no-wake-hints",
        action="store_true",
        help="run every periodic cycle, even those the policy says change nothing (same results)",
    )
    ap.add_argument("--cycle-quantum", type=float, default=0.0, help="> 0: schedule on multiples of this (s)")
    ap.add_argument("--traces-dir", default=None)
    args = ap.parse_args(argv)

    console = Console()
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    t0 = time.perf_counter()
    out = run_sim(
        "philly",
        policies,
        traces_dir=args.traces_dir,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        gpu_model=args.gpu_model,
        limit=args.limit,
        tick_s=args.tick or None,
        wake_hints=not args.no_wake_hints,
        cycle_quantum_s=args.cycle_quantum,
        out_dir=args.out,
        console=console,
    )
    total = time.perf_counter() - t0

    t = Table(title=f"Philly, {out['config']['jobs']:,} jobs, {args.nodes} x {args.gpus_per_node} {args.gpu_model}")
    for col in (
        "policy",
        "wall",
        "cycles (ticks)",
        "in policy",
        "avg JCT",
        "p99 queueing delay",
        "Jain",
        "preemptions",
    ):
        t.add_column(col, justify="left" if col == "policy" else "right")
    slow = []
    for m in out["results"]:
        s = m["sim"]
        if s["total_wall_s"] > BUDGET_S:
            slow.append(m["policy"])
        t.add_row(
            m["policy"],
            f"{s['total_wall_s']:.1f} s",
            f"{s['cycles']:,} ({s['tick_cycles']:,})",
            f"{s['policy_s']:.1f} s",
            fmt_s(m["jct_s"]["mean"]),
            fmt_s(m["queueing_delay_s"]["p99"]),
            f"{m['fairness']['jain_account_slowdown']:.3f}",
            f"{m['preemptions']['total']:,}",
        )
    console.print(t)
    console.print(f"total {total:.1f} s; results in {out['json']}, plot in {out['png']}")
    if slow:
        console.print(f"[red]over the {BUDGET_S:.0f}-s budget: {', '.join(slow)}[/]")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
