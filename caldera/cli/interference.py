"""``caldera interference train|evaluate``: the decay model, offline (needs the extra ``interference``)."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from caldera.config import Settings

app = typer.Typer(help="The co-location decay model (offline; pip install 'caldera[interference]').")
console = Console()

BASELINE = ("random_forest", "identity")
DEFAULT_MODEL = ("extra_trees", "profile+enc")


def _dataset(data_dir: Path | None, records: Path | None = None):
    from caldera.interference.records import gavel_path, load_gavel_pairs, load_profile_records

    if records is not None:
        return records, load_profile_records(records)
    path = gavel_path(data_dir or Settings().shared_data_dir)
    if not path.exists():
        console.print(f"[red]no co-location data at {path}[/red] (set CALDERA_SHARED_DATA_DIR or --data-dir)")
        raise typer.Exit(1)
    return path, load_gavel_pairs(path)


def _need_sklearn() -> None:
    try:
        import sklearn  # noqa: F401
    except ImportError:
        console.print("[red]scikit-learn is missing[/red]: pip install 'caldera[interference]'")
        raise typer.Exit(1) from None


@app.command()
def train(
    data_dir: Path | None = typer.Option(None, help="shared data (CALDERA_SHARED_DATA_DIR, ../shared/data)"),
    estimator: str = typer.Option(DEFAULT_MODEL[0], "--estimator", "-e", help="regressor"),
    features: str = typer.Option(DEFAULT_MODEL[1], "--features", "-f", help="identity, profile or profile+enc"),
    out: Path | None = typer.Option(
        None, help="model file (CALDERA_INTERFERENCE_MODEL, <data dir>/interference.model)"
    ),
    records: Path | None = typer.Option(None, help="train on the platform's records (caldera profile --out) instead"),
) -> None:
    """Train the decay model on every measured co-location and save it, versioned."""
    _need_sklearn()
    from caldera.interference.snapshot import model_path
    from caldera.interference.store import save_model
    from caldera.interference.train import train as fit

    path, ds = _dataset(data_dir, records)
    if not ds.samples:  # e.g. only the solo records the platform measures from running jobs
        console.print(
            f"[red]no co-location samples in {path}[/red]: the decay model learns from measured mixes "
            "(coloc.csv, written by caldera profile next to its solo.csv)"
        )
        raise typer.Exit(1)
    written = save_model(out or model_path(Settings()), fit(ds, estimator, features, source=str(path)))
    console.print(f"{estimator} on {features}: {len(ds.samples)} samples -> {written}")


@app.command()
def evaluate(
    data_dir: Path | None = typer.Option(None, help="shared data (CALDERA_SHARED_DATA_DIR, ../shared/data)"),
    estimator: list[str] = typer.Option([], "--estimator", "-e", help="regressors (default: all)"),
    features: list[str] = typer.Option([], "--features", "-f", help="feature sets (default: profile+enc)"),
    split: list[str] = typer.Option([], "--split", "-s", help="random, pair, family (default: all)"),
) -> None:
    """Cross-validate regressors: MSE, MAE and R² per split, the baseline (random forest on identity) first."""
    _need_sklearn()
    from caldera.interference.train import SPLITS, cross_validate, model_names

    _, ds = _dataset(data_dir)
    combos = [BASELINE] + [(e, f) for f in features or [DEFAULT_MODEL[1]] for e in estimator or model_names()]
    table = Table(title=f"decay model, {len(ds.samples)} Gavel samples")
    for col in ("estimator", "features", "split", "MSE", "MAE", "R²", "s"):
        table.add_column(col, justify="left" if col in ("estimator", "features", "split") else "right")
    for e, f in dict.fromkeys(combos):
        for sp in split or SPLITS:
            sc = cross_validate(ds, e, f, sp)
            table.add_row(e, f, sp, f"{sc.mse:.4f}", f"{sc.mae:.4f}", f"{sc.r2:.3f}", f"{sc.seconds:.0f}")
    console.print(table)
