"""``caldera sim``: replay a trace under several policies and compare them.

Mount in the main CLI with ``app.add_typer(caldera.sim.cli.app, name="sim")``; or call :func:`run_sim` directly.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from caldera.scheduler.registry import POLICIES, get_policy
from caldera.scheduler.snapshot import Policy
from caldera.sim.cluster import ClusterSpec
from caldera.sim.metrics import compute_metrics, write_job_results
from caldera.sim.simulator import (
    DEFAULT_HALF_LIFE_S,
    SimOptions,
    SimProgress,
    SimResult,
    Simulator,
    load_queue_file,
)
from caldera.sim.traces import TraceJob, load_trace, summarize, trace_path

DEFAULT_OUT = Path("out/sim")


def fmt_s(x: float | None) -> str:
    if x is None:
        return "-"
    if x < 120:
        return f"{x:.0f} s"
    if x < 2 * 3600:
        return f"{x / 60:.1f} min"
    if x < 3 * 86400:
        return f"{x / 3600:.2f} h"
    return f"{x / 86400:.2f} d"


def comparison_table(
    results: Sequence[dict[str, Any]], title: str | None = None, wall: dict[str, float] | None = None
) -> Table:
    t = Table(title=title)
    for col, just in [
        ("policy", "left"),
        ("jobs done", "right"),
        ("avg JCT", "right"),
        ("p50 JCT", "right"),
        ("p95 JCT", "right"),
        ("p99 JCT", "right"),
        ("avg wait", "right"),
        ("p99 wait", "right"),
        ("makespan", "right"),
        ("GPU alloc", "right"),
        ("Jain (slowdown)", "right"),
        ("preemptions", "right"),
        ("wall", "right"),
    ]:
        t.add_column(col, justify=just)
    for m in results:
        j = m["jobs"]
        done = f"{j['completed']:,}"
        if j["dropped_never_fit"] or j["unfinished"]:
            done += f" (-{j['dropped_never_fit']} drop, {j['unfinished']} left)"
        w = (wall or {}).get(m["policy"], m["sim"]["wall_s"])
        t.add_row(
            m["policy"],
            done,
            fmt_s(m["jct_s"]["mean"]),
            fmt_s(m["jct_s"]["p50"]),
            fmt_s(m["jct_s"]["p95"]),
            fmt_s(m["jct_s"]["p99"]),
            fmt_s(m["queueing_delay_s"]["mean"]),
            fmt_s(m["queueing_delay_s"]["p99"]),
            fmt_s(m["makespan_s"]),
            f"{100 * m['gpu_allocation']['mean']:.1f}%",
            f"{m['fairness']['jain_account_slowdown']:.3f}",
            f"{m['preemptions']['total']:,}",
            f"{w:.1f} s",
        )
    return t


def _scaled(jobs: Iterable[TraceJob], time_scale: float, arrival_scale: float) -> list[TraceJob]:
    if time_scale == 1.0 and arrival_scale == 1.0:
        return list(jobs)
    f = time_scale * arrival_scale
    return [replace(j, submit_time_s=j.submit_time_s * f, duration_s=j.duration_s * time_scale) for j in jobs]


def run_sim(
    trace: str | Path | Sequence[TraceJob] = "philly",
    policies: Sequence[str] = ("fifo",),
    *,
    traces_dir: str | Path | None = None,
    nodes: int = 64,
    gpus_per_node: int = 8,
    gpu_model: str = "v100",
    cpu_per_node: float = 64.0,
    memory_gib_per_node: float = 512.0,
    cluster: str | ClusterSpec | None = None,
    nodes_csv: str | Path | None = None,
    limit: int | None = None,
    time_scale: float = 1.0,
    arrival_scale: float = 1.0,
    tick_s: float | None = 60.0,
    wake_hints: bool = True,
    cycle_quantum_s: float = 0.0,
    half_life_s: float = DEFAULT_HALF_LIFE_S,
    preempt_grace_s: float = 0.0,
    restart_overhead_s: float = 0.0,
    share: str = "demand",
    runtime_estimate: float | None = None,
    locality_slowdown: float = 0.0,
    node_mtbf_s: float | None = None,
    node_repair_s: float = 3600.0,
    failure_seed: int = 0,
    queue_file: str | Path | None = None,
    policy_options: dict[str, dict[str, Any]] | None = None,
    max_time_s: float | None = None,
    strict: bool = False,
    out_dir: str | Path | None = DEFAULT_OUT,
    plot: bool = True,
    series_points: int = 500,
    trace_options: dict[str, Any] | None = None,
    console: Console | None = None,
    quiet: bool = False,
) -> dict[str, Any]:
    """Replay one trace on one cluster under each policy and compare.

    ``trace``: a trace name (``philly``, ``gavel``, ``alibaba``, ``alibaba-gpushare40``), a path, or a list of
    :class:`TraceJob`. Cluster: ``cluster`` (``ClusterSpec`` or ``"64x8:v100,16x4:a100"``), ``nodes_csv`` (an
    Alibaba-style node list, e.g. the openb one), else ``nodes`` x ``gpus_per_node`` ``gpu_model``.
    ``limit`` keeps the first N jobs; ``time_scale`` multiplies all times (submissions and durations; 0.1 replays
    the same schedule shape 10x shorter, with fewer periodic cycles); ``arrival_scale`` multiplies submissions only
    (< 1 raises the load). ``runtime_estimate`` (>= 1) gives jobs ``max_runtime_s`` = remaining work x it (what
    reservations and backfill use; 1 = exact); ``None`` leaves it unknown. ``policy_options`` maps a policy name to
    the keyword arguments of its factory.

    Returns ``{"config": ..., "results": [one metrics dict per policy], "json": path, "png": path}``; writes
    ``results.json`` and ``comparison.png`` to ``out_dir`` (unless it is ``None``) and prints a Rich table.
    """
    console = console or Console()
    say = (lambda *a, **k: None) if quiet else console.print
    view = {"out_dir": out_dir, "series_points": series_points, "console": None if quiet else console}
    spec = cluster_spec(cluster, nodes_csv, nodes, gpus_per_node, gpu_model, cpu_per_node, memory_gib_per_node)
    t0 = time.perf_counter()
    trace_name, jobs = load_jobs(trace, spec, traces_dir, limit, time_scale, arrival_scale, trace_options)
    load_s = time.perf_counter() - t0
    say(f"[bold]{trace_name}[/]: {len(jobs):,} jobs loaded in {load_s:.2f} s; cluster {spec.describe()}")
    options = SimOptions(
        tick_s=tick_s,
        wake_hints=wake_hints,
        cycle_quantum_s=cycle_quantum_s,
        half_life_s=half_life_s,
        preempt_grace_s=preempt_grace_s,
        restart_overhead_s=restart_overhead_s,
        share=share,
        queues=load_queue_file(queue_file) if queue_file else None,
        strict=strict,
        max_time_s=max_time_s,
        runtime_estimate=runtime_estimate,
        locality_slowdown=locality_slowdown,
        node_mtbf_s=node_mtbf_s,
        node_repair_s=node_repair_s,
        failure_seed=failure_seed,
    )
    results = [
        measure(name, get_policy(name, **((policy_options or {}).get(name, {}))), jobs, spec, options, say, **view)
        for name in policies
    ]
    wall = {m["policy"]: m["sim"]["total_wall_s"] for m in results}

    config = {
        "trace": trace_name,
        "jobs": len(jobs),
        "limit": limit,
        "time_scale": time_scale,
        "arrival_scale": arrival_scale,
        "cluster": spec.to_dict(),
        "policies": list(policies),
        "policy_options": policy_options or {},
        **{name: getattr(options, name) for name in _OPTIONS_IN_CONFIG},
        "queue_file": str(queue_file) if queue_file else None,
        "max_time_s": max_time_s,
    }
    title = f"{trace_name} on {spec.describe()}"
    if not quiet:
        console.print(comparison_table(results, title, wall))
    out: dict[str, Any] = {"config": config, "results": results, "json": None, "png": None}
    if out_dir is not None:
        out.update(write_comparison(Path(out_dir), config, results, title if plot else None))
        say(f"wrote {out['json']}" + (f", {out['png']} and {out['distributions_png']}" if out["png"] else ""))
    return out


# the replay options results.json repeats, in its order
_OPTIONS_IN_CONFIG = (
    "tick_s",
    "wake_hints",
    "cycle_quantum_s",
    "half_life_s",
    "preempt_grace_s",
    "restart_overhead_s",
    "share",
    "runtime_estimate",
    "locality_slowdown",
    "node_mtbf_s",
    "node_repair_s",
    "failure_seed",
)


def cluster_spec(
    cluster: str | ClusterSpec | None,
    nodes_csv: str | Path | None,
    nodes: int,
    gpus_per_node: int,
    gpu_model: str,
    cpu_per_node: float,
    memory_gib_per_node: float,
) -> ClusterSpec:
    """The simulated cluster: ``cluster`` (a spec or ``"64x8:v100,16x4:a100"``), else an Alibaba-style node list,
    else ``nodes`` x ``gpus_per_node`` ``gpu_model``."""
    if isinstance(cluster, ClusterSpec):
        return cluster
    if cluster:
        return ClusterSpec.parse(cluster, cpu_per_node, int(memory_gib_per_node * 1024))
    if nodes_csv:
        return ClusterSpec.from_alibaba_nodes(nodes_csv)
    return ClusterSpec.uniform(nodes, gpus_per_node, gpu_model, cpu_per_node, int(memory_gib_per_node * 1024))


def load_jobs(
    trace: str | Path | Sequence[TraceJob],
    spec: ClusterSpec,
    traces_dir: str | Path | None,
    limit: int | None,
    time_scale: float,
    arrival_scale: float,
    trace_options: dict[str, Any] | None,
) -> tuple[str, list[TraceJob]]:
    """The trace's name (``custom`` for a list of jobs) and its first ``limit`` jobs, in submission order, scaled."""
    if isinstance(trace, (str, Path)):
        jobs = load_trace(
            trace, traces_dir=traces_dir, gpus_per_node=spec.max_gpus_per_node, limit=limit, **(trace_options or {})
        )
        return str(trace), _scaled(jobs, time_scale, arrival_scale)
    jobs = sorted(trace, key=lambda j: (j.submit_time_s, j.id))
    if limit is not None:
        jobs = jobs[:limit]
    return "custom", _scaled(jobs, time_scale, arrival_scale)


def measure(
    name: str,
    policy: Policy,
    jobs: Sequence[TraceJob],
    spec: ClusterSpec,
    options: SimOptions,
    say: Callable[..., None],
    out_dir: str | Path | None,
    series_points: int,
    console: Console | None,
) -> dict[str, Any]:
    """The replay under the policy called ``name``: its metrics, and its per-job CSV ``jobs_<name>.csv`` in
    ``out_dir``."""
    w0 = time.perf_counter()
    res = replay(name, jobs, spec, policy, options, console)
    m = compute_metrics(res, series_points=series_points)
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        m["jobs_csv"] = str(write_job_results(res, Path(out_dir) / f"jobs_{name}.csv"))
    m["policy"] = name  # the registry name, even if the object calls itself otherwise
    m["sim"]["total_wall_s"] = wall = time.perf_counter() - w0
    say(
        f"  {name}: {m['jobs']['completed']:,} jobs done, {res.cycles:,} cycles, "
        f"{wall:.1f} s wall ({res.policy_s:.1f} s in the policy)"
    )
    if m["invalid_decisions"]:
        say(f"  [yellow]{name}: decisions that could not be applied: {m['invalid_decisions']}[/]")
    return m


def replay(
    name: str, jobs: Sequence[TraceJob], spec: ClusterSpec, policy: Policy, options: SimOptions, console: Console | None
) -> SimResult:
    """The replay under the policy called ``name``, with a progress bar on ``console`` (none without one)."""
    if console is None:
        return Simulator(jobs, spec, policy, options).run()
    with _progress(console) as bar:
        task = bar.add_task(name, total=max(len(jobs), 1), sim="")

        def show(p: SimProgress) -> None:
            bar.update(
                task,
                completed=p.finished,
                total=max(p.total, 1),
                sim=f"day {p.now_s / 86400:.1f}, {p.queued:,} queued, {p.running:,} running, {p.cycles:,} cycles",
            )

        return Simulator(jobs, spec, policy, options, progress=show).run()


def write_comparison(
    d: Path, config: dict[str, Any], results: list[dict[str, Any]], plot_title: str | None
) -> dict[str, str | None]:
    """``results.json`` and, with a title, ``comparison.png`` and ``distributions.png`` in ``d``; their paths."""
    d.mkdir(parents=True, exist_ok=True)
    jpath = d / "results.json"
    jpath.write_text(json.dumps({"config": config, "results": results}, indent=1))
    out: dict[str, str | None] = {"json": str(jpath), "png": None}
    if plot_title is not None:
        from caldera.sim.plot import plot_comparison
        from caldera.sim.plot_distributions import plot_distributions

        out["png"] = str(plot_comparison(results, d / "comparison.png", plot_title))
        out["distributions_png"] = str(plot_distributions(results, d / "distributions.png", plot_title))
    return out


def _progress(console: Console) -> Progress:
    """A replay's progress: jobs finished, simulated day, queue and cycles so far, wall time."""
    return Progress(
        TextColumn("replaying under [bold]{task.description}[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("jobs done; {task.fields[sim]}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )


# --------------------------------------------------------------------------------------------------- Typer
app = typer.Typer(
    help="Trace-driven scheduling simulator: replay Philly, Gavel or Alibaba traces under policies.",
    no_args_is_help=True,
)


def _split_policies(values: list[str]) -> list[str]:
    out: list[str] = []
    for v in values:
        out.extend(p.strip() for p in v.split(",") if p.strip())
    return out


@app.command("run")
def run_cmd(
    trace: str = typer.Argument("philly", help="philly, gavel, alibaba, alibaba-gpushare40, or a path"),
    policy: list[str] = typer.Option(["fifo"], "--policy", "-p", help="policy to compare (repeat, or comma-separated)"),
    traces_dir: Path | None = typer.Option(None, help="where named traces are (default: Settings.traces_dir)"),
    nodes: int = typer.Option(64, help="simulated nodes"),
    gpus_per_node: int = typer.Option(8, help="GPUs per node"),
    gpu_model: str = typer.Option("v100", help="GPU model of the nodes"),
    cpu_per_node: float = typer.Option(64.0, help="CPU cores per node"),
    memory_gib_per_node: float = typer.Option(512.0, help="memory per node (GiB)"),
    cluster: str | None = typer.Option(None, help='node groups, e.g. "32x8:v100,16x4:a100" (overrides --nodes)'),
    nodes_csv: Path | None = typer.Option(None, help="an Alibaba-style node list CSV to simulate"),
    limit: int | None = typer.Option(None, help="only the first N jobs"),
    time_scale: float = typer.Option(1.0, help="multiply all trace times (submissions and durations)"),
    arrival_scale: float = typer.Option(1.0, help="multiply submission times only (< 1 raises the load)"),
    tick: float = typer.Option(60.0, help="periodic cycle while jobs wait, simulated seconds (0: events only)"),
    wake_hints: bool = typer.Option(
        True, "--wake-hints/--no-wake-hints", help="skip periodic cycles the policy says cannot change anything"
    ),
    cycle_quantum: float = typer.Option(0.0, help="> 0: schedule only on multiples of this many seconds"),
    half_life: float = typer.Option(DEFAULT_HALF_LIFE_S, help="fair-share usage half-life (s)"),
    preempt_grace: float = typer.Option(0.0, help="seconds a preempted job keeps its GPUs"),
    restart_overhead: float = typer.Option(0.0, help="seconds of work added when a preempted job resumes"),
    share: str = typer.Option("demand", help="generated queues' deserved GPU share: demand, equal or none"),
    runtime_estimate: float | None = typer.Option(None, help="jobs declare max_runtime_s = work x this (>= 1)"),
    locality_slowdown: float = typer.Option(
        0.0, help="a gang spread over more nodes than needed runs this much slower (unless the trace measured it)"
    ),
    node_mtbf: float | None = typer.Option(None, help="each node fails after exponential times of this mean (s)"),
    node_repair: float = typer.Option(3600.0, help="how long a failed node stays down (s)"),
    queue_file: Path | None = typer.Option(None, help="JSON/YAML queue configs (QueueConfig list)"),
    policy_options: str | None = typer.Option(None, help='JSON: {"caldera": {"option": value}, ...}'),
    max_time: float | None = typer.Option(None, help="stop at this simulated time (s)"),
    strict: bool = typer.Option(False, help="fail on decisions that cannot be applied"),
    out: Path = typer.Option(DEFAULT_OUT, "--out", "-o", help="directory for results.json and comparison.png"),
    no_plot: bool = typer.Option(False, "--no-plot", help="skip the PNG"),
    throughputs: Path | None = typer.Option(None, help="Gavel's throughputs JSON, for Gavel traces"),
    skip_unmeasured: bool = typer.Option(
        False, help="Gavel traces: leave out jobs whose type and GPU count Gavel measured no throughput for"
    ),
) -> None:
    """Replay a trace under one or more policies and print a side-by-side comparison."""
    names = _split_policies(policy)
    unknown = [p for p in names if p not in POLICIES]
    if unknown:
        raise typer.BadParameter(f"unknown policy {', '.join(unknown)}; known: {', '.join(sorted(POLICIES))}")
    try:
        run_sim(
            trace,
            names,
            traces_dir=traces_dir,
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            gpu_model=gpu_model,
            cpu_per_node=cpu_per_node,
            memory_gib_per_node=memory_gib_per_node,
            cluster=cluster,
            nodes_csv=nodes_csv,
            limit=limit,
            time_scale=time_scale,
            arrival_scale=arrival_scale,
            tick_s=tick or None,
            wake_hints=wake_hints,
            cycle_quantum_s=cycle_quantum,
            half_life_s=half_life,
            preempt_grace_s=preempt_grace,
            restart_overhead_s=restart_overhead,
            share=share,
            runtime_estimate=runtime_estimate,
            locality_slowdown=locality_slowdown,
            node_mtbf_s=node_mtbf,
            node_repair_s=node_repair,
            queue_file=queue_file,
            policy_options=json.loads(policy_options) if policy_options else None,
            max_time_s=max_time,
            strict=strict,
            out_dir=out,
            plot=not no_plot,
            trace_options=_trace_options(throughputs, skip_unmeasured),
        )
    except (FileNotFoundError, ValueError) as exc:  # a missing or bad input file: say so, no traceback
        Console(stderr=True).print(f"[red]error:[/] {exc}")
        raise typer.Exit(1) from None


def _trace_options(throughputs: Path | None, skip_unmeasured: bool) -> dict | None:
    options: dict = {"throughputs": throughputs} if throughputs else {}
    if skip_unmeasured:  # as Gavel's own simulator does (else such a job runs at its closest measured scale)
        options["missing"] = "skip"
    return options or None


@app.command("info")
def info_cmd(
    trace: str = typer.Argument("philly", help="philly, gavel, alibaba, alibaba-gpushare40, or a path"),
    traces_dir: Path | None = typer.Option(None, help="where named traces are (default: Settings.traces_dir)"),
    gpus_per_node: int = typer.Option(8, help="split gangs for nodes of this size"),
) -> None:
    """Load a trace and print what is in it."""
    t0 = time.perf_counter()
    jobs = load_trace(trace, traces_dir=traces_dir, gpus_per_node=gpus_per_node)
    s = summarize(jobs)
    try:
        where: object = trace_path(trace, traces_dir)
    except ValueError:
        where = trace
    Console().print(f"{where}: loaded in {time.perf_counter() - t0:.2f} s")
    Console().print_json(json.dumps(s))


@app.command("policies")
def policies_cmd() -> None:
    """List the policies the registry knows."""
    for name in sorted(POLICIES):
        typer.echo(name)


@app.command("sharing")
def sharing_cmd(
    data_dir: Path | None = typer.Option(None, help="shared data with colocation/ and traces/ (../shared/data)"),
    nodes: int = typer.Option(6, help="simulated V100 nodes"),
    gpus_per_node: int = typer.Option(8, help="GPUs per node"),
    limit: int | None = typer.Option(1500, help="replay this many jobs of Gavel's traces (0: all)"),
    skip: int = typer.Option(0, help="starting after this many (another window)"),
    tolerance: float = typer.Option(0.45, help="the slowdown each shared job accepts"),
    prefer_gain: float | None = typer.Option(0.6, help="join a partner instead of a free GPU above this gain"),
    seed: int = typer.Option(0, help="which half of the V100 pairs the decay model never sees"),
    estimator: str = typer.Option("auto", help="the decay model's regressor (auto: the best in validation)"),
) -> None:
    """GPU sharing on Gavel's traces: exclusive FIFO, naive packing and interference-aware sharing in one run
    (real speeds from Gavel's measured pairs; the scheduler sees only the decay model's predictions)."""
    try:
        import sklearn  # noqa: F401
    except ImportError:
        Console(stderr=True).print("[red]error:[/] scikit-learn is missing: pip install 'caldera[interference]'")
        raise typer.Exit(1) from None
    from caldera.config import Settings
    from caldera.sim.sharing_experiment import markdown_table, run_experiment

    data = data_dir or Settings().shared_data_dir
    try:
        ex = run_experiment(
            data,
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            limit=limit or None,
            skip=skip,
            tolerance=tolerance,
            prefer_gain=prefer_gain,
            estimator=estimator,
            seed=seed,
        )
    except FileNotFoundError as exc:
        Console(stderr=True).print(f"[red]error:[/] {exc} (set CALDERA_SHARED_DATA_DIR or --data-dir)")
        raise typer.Exit(1) from None
    typer.echo(f"{ex.summary()} on {nodes} x {gpus_per_node} V100\n")
    typer.echo(markdown_table(ex.outcomes))
