"""Scheduling quality: every policy on the Philly, Gavel and Alibaba traces at two cluster sizes each.

    python benchmarks/sim_quality.py [OUT_DIR] [--limit N] [--offset K] [--restart-overhead 300]
                                     [--policies fifo,tiresias,caldera] [--only TRACE] [--policy-options JSON]
                                     [--variant NAME=JSON ...]

For each (trace, cluster) it replays ``--limit`` jobs from the ``--offset``-th on (another window of the trace, to
check that a result is not one slice's) under each policy, with ``--restart-overhead`` seconds of lost work
charged per preemption, prints one table (policy x avg / p50 / p99 JCT, p99 wait, makespan, GPU allocation, Jain's
fairness over accounts, preemptions and the most of any one job) and writes, per case, ``results.json``, the
per-job CSVs and ``comparison.png`` under OUT_DIR (default ``out/sim_quality``), and ``tables.md`` with every table.

``--variant NAME=JSON`` (repeatable) adds a row ``caldera, NAME``: caldera with those options on the same jobs (its
files under the case's ``NAME/``). With Tiresias in the table, the last column says which of issue 30's criteria a
caldera row misses against it: GPU allocation at least Tiresias' minus 1 point (``alloc``), makespan at most 2%
longer (``makespan``), no more preemptions (``preemptions``), p99 JCT no worse (``p99``), average JCT lower
(``avg``); ``met``: none.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console  # noqa: E402

from caldera.scheduler.registry import get_policy  # noqa: E402
from caldera.sim.cli import fmt_s, run_sim  # noqa: E402
from caldera.sim.traces import TraceJob, load_trace  # noqa: E402

# (trace, label, cluster, trace options): two sizes each, both loaded enough for queues to form (the first 1,500
# jobs ask on average for 240 GPUs on Philly, 232 on Gavel's trace, 16 on Alibaba's)
CASES = [
    ("philly", "philly", "20x8:v100", {}),
    ("philly", "philly", "40x8:v100", {}),
    ("gavel", "gavel", "32x8:v100", {}),
    ("gavel", "gavel", "48x8:v100", {}),
    ("alibaba", "alibaba", "2x8:v100", {}),
    ("alibaba", "alibaba", "3x8:v100", {}),
    # the same pods with the QoS classes as accounts only, every pod ``normal``: Tiresias knows no classes, so this
    # is where Jain's index over those accounts compares like with like
    ("alibaba", "alibaba-no-classes", "2x8:v100", {"qos_priority": False}),
    ("alibaba", "alibaba-no-classes", "3x8:v100", {"qos_priority": False}),
]


def window(trace: str, offset: int, limit: int, traces_dir: str | None, options: dict) -> list[TraceJob]:
    """Jobs ``offset`` to ``offset + limit`` of a trace in submission order, with times from the first of them
    (``options``: the trace loader's, as ``run_sim`` passes them for a whole trace)."""
    jobs = load_trace(trace, traces_dir=traces_dir, limit=offset + limit, **options)[offset:]
    t0 = jobs[0].submit_time_s if jobs else 0.0
    for j in jobs:
        j.submit_time_s -= t0
    return jobs


def misses(m: dict, tiresias: dict) -> list[str]:
    """Issue 30's criteria that a caldera result ``m`` misses against Tiresias' on the same jobs (see the module
    docstring)."""
    out = []
    if m["gpu_allocation"]["mean"] < tiresias["gpu_allocation"]["mean"] - 0.01:
        out.append("alloc")
    if m["makespan_s"] > 1.02 * tiresias["makespan_s"]:
        out.append("makespan")
    if m["preemptions"]["total"] > tiresias["preemptions"]["total"]:
        out.append("preemptions")
    if m["jct_s"]["p99"] > tiresias["jct_s"]["p99"]:
        out.append("p99")
    if m["jct_s"]["mean"] >= tiresias["jct_s"]["mean"]:
        out.append("avg")
    return out


def markdown(title: str, results: list[dict]) -> str:
    tiresias = next((m for m in results if m["policy"] == "tiresias"), None)
    rows = [
        f"**{title}**",
        "",
        "| policy | avg JCT | p50 JCT | p99 JCT | p99 wait | makespan | GPU alloc | Jain | preemptions "
        "| most of one job | misses (issue 30) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for m in results:
        missed = ""
        if tiresias is not None and m["policy"].startswith("caldera"):
            missed = ", ".join(misses(m, tiresias)) or "met"
        rows.append(
            f"| {m['policy']} | {fmt_s(m['jct_s']['mean'])} | {fmt_s(m['jct_s']['p50'])} | "
            f"{fmt_s(m['jct_s']['p99'])} | {fmt_s(m['queueing_delay_s']['p99'])} | {fmt_s(m['makespan_s'])} | "
            f"{100 * m['gpu_allocation']['mean']:.1f}% | {m['fairness']['jain_account_slowdown']:.3f} | "
            f"{m['preemptions']['total']:,} | {m['preemptions']['max_per_job']:,} | {missed} |"
        )
    return "\n".join(rows) + "\n"


def variant(text: str) -> tuple[str, dict]:
    """``NAME=JSON`` of ``--variant``: a row name and caldera's options for it."""
    name, sep, options = text.partition("=")
    value = json.loads(options) if sep else None
    if not name or not isinstance(value, dict):
        raise argparse.ArgumentTypeError("a variant is NAME={JSON object of caldera options}")
    get_policy("caldera", **value)  # a bad option fails now, not minutes into a replay
    return name, value


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", default="out/sim_quality")
    ap.add_argument("--limit", type=int, default=1500, help="N jobs of each trace (default 1500)")
    ap.add_argument("--offset", type=int, default=0, help="skip the first K jobs (default 0)")
    ap.add_argument("--restart-overhead", type=float, default=300.0)
    ap.add_argument("--policies", default="fifo,tiresias,caldera")
    ap.add_argument(
        "--only",
        default=None,
        help="only the cases whose trace name, or label_cluster (alibaba_3x8, alibaba-no-classes_2x8), contains this",
    )
    ap.add_argument("--traces-dir", default=None)
    ap.add_argument("--policy-options", type=json.loads, default=None, help='JSON: {"caldera": {"option": value}, ...}')
    ap.add_argument(
        "--variant", type=variant, action="append", default=[], help="NAME=JSON: a row of caldera with these options"
    )
    args = ap.parse_args(argv)
    if args.policy_options is not None and not isinstance(args.policy_options, dict):
        ap.error("--policy-options: a JSON object of policy names, each with an object of options")
    for name, options in (args.policy_options or {}).items():  # a bad option fails now, not minutes into a replay
        try:
            get_policy(name, **options)
        except (TypeError, ValueError) as exc:
            ap.error(f"--policy-options: {exc}")
    console = Console()
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    out = Path(args.out)
    tables = []
    for trace, label, cluster, topts in CASES:
        if args.only and args.only not in trace and args.only not in f"{label}_{cluster}":
            continue
        case_dir = out / f"{label}_{cluster.replace(':', '_')}"
        jobs = window(trace, args.offset, args.limit, args.traces_dir, topts) if args.offset else trace
        common = dict(
            traces_dir=args.traces_dir,
            cluster=cluster,
            limit=args.limit,
            restart_overhead_s=args.restart_overhead,
            trace_options=topts or None,
            console=console,
        )
        res = run_sim(jobs, policies, policy_options=args.policy_options, out_dir=case_dir, **common)
        for name, options in args.variant:
            more = run_sim(jobs, ["caldera"], policy_options={"caldera": options}, out_dir=case_dir / name, **common)
            res["results"] += [{**m, "policy": f"caldera, {name}"} for m in more["results"]]
        n = res["config"]["jobs"]
        which = f"jobs {args.offset:,}-{args.offset + n:,}" if args.offset else f"first {n:,} jobs"
        title = f"{label}, {which}, {cluster}, {args.restart_overhead:.0f} s per preemption"
        tables.append(markdown(title, res["results"]))
        out.mkdir(parents=True, exist_ok=True)
        (out / "tables.md").write_text("\n".join(tables))
    console.print("\n".join(tables))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
