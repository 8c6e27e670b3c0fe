"""One PNG comparing policies: GPU allocation over time, queue length over time and the JCT CDF."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def plot_comparison(metrics: Sequence[dict[str, Any]], path: str | Path, title: str | None = None) -> Path:
    """Draw from :func:`caldera.sim.metrics.compute_metrics` outputs (one per policy), with the Agg backend."""
    path, fig, (ax_a, ax_q, ax_c) = new_figure(path, 3, 1, (10, 11))
    span = max((max(m["gpu_allocation"]["t_s"] or [0]) for m in metrics), default=0.0)
    unit, scale = ("days", 86400.0) if span > 3 * 86400 else ("hours", 3600.0) if span > 3 * 3600 else ("s", 1.0)
    for m in metrics:
        name = m["policy"]
        al = m["gpu_allocation"]
        ax_a.step(
            [t / scale for t in al["t_s"]],
            [100 * r for r in al["rate"]],
            where="post",
            label=f"{name} (mean {100 * al['mean']:.1f}%)",
            linewidth=1,
        )
        q = m["queue_length"]
        ax_q.step([t / scale for t in q["t_s"]], q["jobs"], where="post", label=name, linewidth=1)
        cdf = m["jct_cdf"]
        if cdf["jct_s"]:
            avg = m["jct_s"]["mean"]
            ax_c.plot(cdf["jct_s"], cdf["fraction"], label=f"{name} (avg {avg / 3600:.2f} h)")
    ax_a.set_ylabel("GPUs allocated (%)")
    ax_a.set_xlabel(f"simulated time ({unit})")
    ax_a.set_ylim(0, 105)
    ax_a.set_title("GPU allocation")
    ax_q.set_ylabel("queued jobs")
    ax_q.set_xlabel(f"simulated time ({unit})")
    ax_q.set_title("queue length")
    ax_c.set_xscale("log")
    ax_c.set_xlabel("job completion time (s)")
    ax_c.set_ylabel("fraction of jobs")
    ax_c.set_ylim(0, 1.01)
    ax_c.set_title("JCT CDF")
    return save_figure(fig, (ax_a, ax_q, ax_c), title, path, dpi=110)


def new_figure(path: str | Path, rows: int, cols: int, figsize: tuple[float, float]) -> tuple[Path, Any, Any]:
    """A figure drawn with the Agg backend (no display), and its folder made."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(rows, cols, figsize=figsize)
    return path, fig, axes


def save_figure(fig: Any, axes: Sequence[Any], title: str | None, path: Path, dpi: int) -> Path:
    """Grid and legends on every panel, the title, written to ``path`` and closed."""
    import matplotlib.pyplot as plt

    for ax in axes:
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
