"""`caldera usage --since 7d` (GPU-hours allocated and used per day, as a table, JSON, YAML, CSV or a plot; with
--idle the low-utilisation list: GPU-hours allocated but idle per user or account, the most idle first) and
`caldera top` (the GPUs held now and how busy they are, refreshed live), on the SDK like every verb."""

from __future__ import annotations

import csv
import sys
import time
from enum import Enum
from pathlib import Path

import typer
from rich.live import Live
from rich.table import Table

from caldera.cli.common import call, client, console, err
from caldera.cli.output import Format, emit


class UsageFormat(str, Enum):
    table = "table"
    json = "json"
    yaml = "yaml"
    csv = "csv"


USAGE_OUTPUT = typer.Option(UsageFormat.table, "--output", "-o", help="table, json, yaml; csv with --since")
SINCE = typer.Option(None, help="GPU-hours per day since then: 7d, 12h, 2w or a UTC date 2026-12-01")
BY = typer.Option("user", help="with --since: per user, account or queue")
IDLE = typer.Option(False, "--idle", help="GPU-hours allocated but idle per user or account since --since (7d)")
PLOT = typer.Option(None, help="with --since: also draw the days into this PNG (needs matplotlib)")


def _available(view: dict) -> dict:
    """The view, or exit 1 with why the platform has no metrics."""
    if not view.get("available"):
        err.print(f"[red]no metrics:[/red] {view.get('reason')}")
        raise typer.Exit(1)
    return view


def gpu_hours(since: str, by: str, output: UsageFormat, plot: Path | None) -> None:
    view = _available(call(client().gpu_hours, since, by))
    days = view["days"]
    if output is UsageFormat.csv:
        writer = csv.writer(sys.stdout)
        writer.writerow(["day", by, "allocated_gpu_hours", "used_gpu_hours"])
        writer.writerows([r["day"], r[by], r["allocated_gpu_hours"], r["used_gpu_hours"]] for r in days)
    else:
        emit(view, Format(output.value), lambda v: _hours_table(v["days"], by))
    if plot is not None:
        _plot(days, by, plot)


def idle_hours(since: str, by: str, output: UsageFormat) -> None:
    view = _available(call(client().idle_gpu_hours, since, by))
    columns = (by, "idle_gpu_hours", "allocated_gpu_hours", "used_gpu_hours", "used_percent")
    if output is UsageFormat.csv:
        writer = csv.writer(sys.stdout)
        writer.writerow(columns)
        writer.writerows([r[c] for c in columns] for r in view["rows"])
        return
    emit(view, Format(output.value), lambda v: _idle_table(v["rows"], by))


def _idle_table(rows: list[dict], by: str) -> None:
    t = Table(by.upper(), "IDLE GPU-H", "ALLOCATED GPU-H", "USED GPU-H", "USED", box=None)
    for r in rows:
        hours = (f"{r[k]:.2f}" for k in ("idle_gpu_hours", "allocated_gpu_hours", "used_gpu_hours"))
        t.add_row(r[by], *hours, _share(r))
    console.print(t)


def _hours_table(days: list[dict], by: str) -> None:
    t = Table("DAY", by.upper(), "ALLOCATED GPU-H", "USED GPU-H", "USED", box=None)
    for r in days:
        t.add_row(r["day"], r[by], f"{r['allocated_gpu_hours']:.2f}", f"{r['used_gpu_hours']:.2f}", _share(r))
    allocated = sum(r["allocated_gpu_hours"] for r in days)
    used = sum(r["used_gpu_hours"] for r in days)
    totals = {"allocated_gpu_hours": allocated, "used_gpu_hours": used}
    t.add_row("[bold]total[/bold]", "", f"{allocated:.2f}", f"{used:.2f}", _share(totals))
    console.print(t)


def _share(r: dict) -> str:
    return f"{100 * r['used_gpu_hours'] / r['allocated_gpu_hours']:.0f}%" if r["allocated_gpu_hours"] else "-"


def _plot(days: list[dict], by: str, path: Path) -> None:
    """Allocated GPU-hours per day as bars, one colour per user (account, queue), the used part darker."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        err.print("[red]--plot needs matplotlib (pip install matplotlib)[/red]")
        raise typer.Exit(1) from None
    dates = sorted({r["day"] for r in days})
    fig, ax = plt.subplots(figsize=(max(6, len(dates) * 0.6), 4))
    bottom = [0.0] * len(dates)
    for i, key in enumerate(sorted({r[by] for r in days})):
        rows = {r["day"]: r for r in days if r[by] == key}
        allocated = [rows[d]["allocated_gpu_hours"] if d in rows else 0.0 for d in dates]
        used = [rows[d]["used_gpu_hours"] if d in rows else 0.0 for d in dates]
        colour = f"C{i % 10}"
        ax.bar(dates, allocated, bottom=bottom, color=colour, alpha=0.35, label=f"{key} allocated")
        ax.bar(dates, used, bottom=bottom, color=colour, label=f"{key} used")
        bottom = [b + a for b, a in zip(bottom, allocated, strict=True)]
    ax.set_ylabel("GPU-hours")
    ax.set_title(f"GPU-hours per day by {by}")
    ax.legend(fontsize="small")
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    err.print(f"plot: {path}")


def _top_table(held: dict, nodes: list[dict]) -> Table:
    free: dict[str, list[int]] = {}
    for n in nodes:
        for d in n["gpus"]:
            free.setdefault(d["model"], [0, 0])[1] += 1
            free[d["model"]][0] += int(d["job"] is None and n["schedulable"])
    means = {m["model"]: m["mean_percent"] for m in held.get("models", [])}
    title = "  ".join(
        f"{model}: {f}/{total} free, held {means[model]:.0f}% busy" if model in means else f"{model}: {f}/{total} free"
        for model, (f, total) in sorted(free.items())
    )
    t = Table("NODE", "GPU", "MODEL", "JOB", "USER", "UTIL", box=None, title=title, title_justify="left")
    if not held.get("available"):
        t.caption = f"no metrics: {held.get('reason')}"
    for g in held.get("gpus", []):
        t.add_row(g["node"], g["gpu"], g["gpu_model"], g["job"], g["user"], _bar(g["mean_percent"]))
    return t


def _bar(percent: float, width: int = 10) -> str:
    filled = round(percent / 100 * width)
    return f"{'█' * filled}{'·' * (width - filled)} {percent:3.0f}%"


def top(
    once: bool = typer.Option(False, "--once", help="print the table once and exit"),
    interval: float = typer.Option(5.0, min=1.0, help="seconds between refreshes"),
    window: int = typer.Option(60, min=60, max=86400, help="utilisation averaged over this many seconds"),
) -> None:
    """The GPUs held now (yours; an admin: all), how busy each is, and the free ones per model; live until Ctrl-C."""
    api = client()

    def table() -> Table:
        return _top_table(call(api.allocated_gpus, window), call(api.nodes))

    if once:
        console.print(table())
        return
    with Live(table(), console=console, refresh_per_second=1, screen=False) as live:
        try:
            while True:
                time.sleep(interval)
                live.update(table())
        except KeyboardInterrupt:
            pass
