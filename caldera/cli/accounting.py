"""`caldera accounting --since 30d [--csv]`: one row per job that ended, as Slurm's sacct, on the SDK."""

from __future__ import annotations

import csv
import sys
from datetime import UTC, datetime

import typer
from rich.table import Table

from caldera.cli.common import call, client, console, ts
from caldera.cli.output import OUTPUT, Format, emit

COLUMNS = ("id", "name", "user", "account", "queue", "state", "exit_code", "gpus", "start", "end", "gpu_hours")


def accounting(
    since: str = typer.Option("30d", help="jobs that ended since then: 30d, 12h, 2w or a UTC date 2026-12-01"),
    as_csv: bool = typer.Option(False, "--csv", help="CSV on stdout (times in UTC, ISO 8601)"),
    output: Format = OUTPUT,
) -> None:
    """Jobs that ended, with their GPU-hours: yours (an admin: everyone's)."""
    view = call(client().accounting, since)
    if as_csv:
        writer = csv.writer(sys.stdout)
        writer.writerow(COLUMNS)
        writer.writerows([_iso(j[c]) if c in ("start", "end") else j[c] for c in COLUMNS] for j in view["jobs"])
        return
    emit(view, output, _table)


def _iso(t: float | None) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds") if t else ""


def _table(view: dict) -> None:
    t = Table(box=None)
    for col in ("ID", "NAME", "USER", "ACCOUNT", "QUEUE", "STATE", "GPUS", "START", "END", "GPU-H"):
        t.add_column(col, no_wrap=col == "ID", overflow="fold")
    for j in view["jobs"]:
        row = (j["id"], j["name"], j["user"] or "", j["account"], j["queue"], j["state"], str(j["gpus"]))
        t.add_row(*row, ts(j["start"]), ts(j["end"]), f"{j['gpu_hours']:.2f}")
    total = sum(j["gpu_hours"] for j in view["jobs"])
    t.add_row("[bold]total[/bold]", f"{len(view['jobs'])} jobs", *[""] * 7, f"{total:.2f}")
    console.print(t)
