"""``caldera profile``: measure the workload zoo alone and in mixes, writing solo.csv and coloc.csv."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

console = Console()


def profile_command(
    workloads: str = typer.Option("all", help="comma-separated zoo names, or all"),
    batch_sizes: str = typer.Option("8", help="comma-separated batch sizes"),
    amp: str = typer.Option("off", help="off, on or both"),
    mix_size: list[int] = typer.Option([2], "--mix-size", help="jobs per mix (2, 3); repeat for both"),
    max_mixes: int | None = typer.Option(None, help="at most this many mixes"),
    seconds: float = typer.Option(5.0, help="timed loop per measurement"),
    min_iters: int = typer.Option(5, help="at least this many timed iterations"),
    device: str = typer.Option("auto", help="cpu, cuda, cuda:N or auto (cuda when available)"),
    width: int = typer.Option(1, help="model size multiplier (1 is CPU-sized)"),
    out: Path = typer.Option(Path("out/profile"), help="directory for solo.csv and coloc.csv"),
) -> None:
    """Profile the zoo of PyTorch workloads (random weights, synthetic data): speed, CPU and memory; NVML metrics
    on a GPU. Records use the reference platform's column names."""
    from caldera.interference.profile.harness import Limits, RunSpec, profile
    from caldera.interference.profile.zoo import WORKLOADS

    names = list(WORKLOADS) if workloads == "all" else [w.strip() for w in workloads.split(",") if w.strip()]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        console.print(f"[red]unknown workloads {unknown}[/red]; the zoo: {', '.join(WORKLOADS)}")
        raise typer.Exit(1)
    if amp not in ("off", "on", "both"):
        raise typer.BadParameter("amp is off, on or both")
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    amps = {"off": [False], "on": [True], "both": [False, True]}[amp]
    specs = [RunSpec(n, int(b), a) for n in names for b in batch_sizes.split(",") for a in amps]
    lim = Limits(seconds=seconds, min_iters=min_iters, width=width)
    solo, coloc = profile(specs, out, device=device, mix_sizes=mix_size, max_mixes=max_mixes, limits=lim)
    console.print(f"{len(specs)} solo runs on {device} -> {solo}; mixes -> {coloc}")
