"""One PNG of the distributions a researcher reads a comparison by: wait and slowdown CDFs, mean JCT and wait per
account, and preemptions over time, one line or bar per policy."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from caldera.sim.plot import new_figure, save_figure


def plot_distributions(metrics: Sequence[dict[str, Any]], path: str | Path, title: str | None = None) -> Path:
    """Draw from :func:`caldera.sim.metrics.compute_metrics` outputs (one per policy), with the Agg backend."""
    path, fig, ((ax_w, ax_s), (ax_a, ax_p)) = new_figure(path, 2, 2, (13, 9))
    for m in metrics:
        name = m["policy"]
        w = m["wait_cdf"]
        if w["wait_s"]:
            ax_w.plot(w["wait_s"], w["fraction"], label=f"{name} (p99 {m['queueing_delay_s']['p99'] / 3600:.2f} h)")
        s = m["slowdown_cdf"]
        if s["slowdown"]:
            ax_s.plot(s["slowdown"], s["fraction"], label=f"{name} (mean {m['slowdown']['mean']:.1f})")
        p = m["preemptions_over_time"]
        ax_p.plot([t / 86400 for t in p["t_s"]], p["count"], label=f"{name} ({m['preemptions']['total']:,})")
    _per_account(ax_a, metrics)
    for ax, xlabel, ttl in (
        (ax_w, "queueing delay before the first start (s)", "wait CDF"),
        (ax_s, "bounded slowdown (JCT / max(run time, 10 s))", "slowdown CDF"),
    ):
        ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("fraction of jobs")
        ax.set_ylim(0, 1.01)
        ax.set_title(ttl)
    ax_p.set_xlabel("simulated time (days)")
    ax_p.set_ylabel("preemptions so far")
    ax_p.set_title("preemptions over time")
    return save_figure(fig, (ax_w, ax_s, ax_a, ax_p), title, path, dpi=100)


def _per_account(ax, metrics: Sequence[dict[str, Any]], most: int = 12) -> None:
    """Mean JCT per account (the ``most`` accounts with most jobs), one bar per policy, wait as the hatched part."""
    first = metrics[0]["fairness"]["per_account"] if metrics else {}
    names = sorted(first, key=lambda a: -first[a]["jobs"])[:most]
    width = 0.8 / max(len(metrics), 1)
    for k, m in enumerate(metrics):
        acc = m["fairness"]["per_account"]
        xs = [i + k * width for i in range(len(names))]
        jct = [acc.get(a, {}).get("mean_jct_s", 0.0) / 3600 for a in names]
        wait = [acc.get(a, {}).get("mean_wait_s", 0.0) / 3600 for a in names]
        bars = ax.bar(xs, jct, width, label=f"{m['policy']} JCT")
        ax.bar(xs, wait, width, color=bars.patches[0].get_facecolor() if bars.patches else None, hatch="//",
               edgecolor="black", linewidth=0.3)  # fmt: skip
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(names))], names, rotation=30, ha="right", fontsize=8)
    ax.set_yscale("symlog", linthresh=1.0)
    ax.set_ylabel("hours (hatched: of which waiting)")
    ax.set_title("mean JCT per account")
