"""The sharing experiment of ``caldera sim sharing`` and benchmarks/interference_sharing.py: train the decay model
without the V100 measurements of half the job-type pairs (``seed`` picks which), replay Gavel's traces under
exclusive FIFO, naive packing and interference-aware sharing (caldera/sim/sharing_sim.py), and format the result.
Needs scikit-learn (the extra ``interference``)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from caldera.interference.records import gavel_path, load_gavel_pairs
from caldera.sim.sharing_sim import Outcome, compare, held_out_pairs, is_held_out, load_gavel_jobs

GAVEL_TRACES = Path("traces") / "gavel_msr_seed0"


@dataclass(slots=True)
class SharingExperiment:
    seed: int
    trained_samples: int
    train_s: float
    held_out_samples: int
    held_out_mae: float
    held_out_p95_error: float
    jobs: int
    one_gpu_jobs: int
    outcomes: list[Outcome]

    def summary(self) -> str:
        return (
            f"decay model trained on {self.trained_samples} samples in {self.train_s:.0f} s (split seed {self.seed}); "
            f"on the {self.held_out_samples} held-out V100 samples: MAE {self.held_out_mae:.3f}, p95 error "
            f"{self.held_out_p95_error:.3f}\n{self.jobs} jobs ({self.one_gpu_jobs} one-GPU, shareable)"
        )


def run_experiment(
    data_dir: str | Path,
    *,
    nodes: int,
    gpus_per_node: int = 8,
    limit: int | None = None,
    skip: int = 0,
    tolerance: float = 0.45,
    prefer_gain: float | None = 0.6,
    max_jobs_per_gpu: int = 2,
    estimator: str = "extra_trees",
    seed: int = 0,
    oracle: bool = False,
    match_window: int = 1,
    min_gain: float = 0.0,
    keep_order: bool = False,
    drain_for_blocked: bool = False,
    pair_on_free: bool = False,
    share_gangs: bool = False,
) -> SharingExperiment:
    """``skip`` and ``limit``: replay jobs ``skip .. skip + limit`` of the traces by arrival (another window)."""
    from caldera.interference.train import train

    ds = load_gavel_pairs(gavel_path(data_dir))
    t0 = time.perf_counter()
    held_out = held_out_pairs(ds, "v100", seed)
    trained = [s for s in ds.samples if not is_held_out(s, held_out)]
    mf = train(ds, estimator, "profile+enc", samples=trained)
    train_s = time.perf_counter() - t0
    test = [s for s in ds.samples if is_held_out(s, held_out)]
    err = np.abs(mf.model.predict_samples(test, ds.profiles) - np.array([s.decay for s in test]))
    jobs = load_gavel_jobs(Path(data_dir) / GAVEL_TRACES, ds)
    jobs = jobs[skip : skip + limit if limit else None]
    if skip:  # the window starts at time 0, as the traces do
        t_first = jobs[0].arrival
        for j in jobs:
            j.arrival -= t_first
    outs = compare(
        ds,
        jobs,
        mf.predictor(),
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        tolerance=tolerance,
        prefer_gain=prefer_gain,
        max_jobs_per_gpu=max_jobs_per_gpu,
        oracle=oracle,
        match_window=match_window,
        min_gain=min_gain,
        keep_order=keep_order,
        drain_for_blocked=drain_for_blocked,
        pair_on_free=pair_on_free,
        share_gangs=share_gangs,
    )
    one_gpu = sum(1 for j in jobs if j.gpus == 1)
    mae, p95 = float(err.mean()), float(np.percentile(err, 95))
    return SharingExperiment(seed, len(trained), train_s, len(test), mae, p95, len(jobs), one_gpu, outs)


def markdown_table(outs: list[Outcome]) -> str:
    base = outs[0]
    lines = [
        "| policy | eff. util (busy GPU) | cluster tput | avg JCT h | JCT vs FIFO | makespan h | p95 decay | "
        "bad co-locations | co-locations (gangs) | OOMs | gang share | eff. util (1-GPU jobs' GPUs) | "
        "eff. util (gangs' GPUs) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for o in outs:
        lines.append(
            f"| {o.policy} | {o.eff_util_busy:.3f} | {o.cluster_throughput:.3f} | {o.avg_jct_s / 3600:.1f} | "
            f"{base.avg_jct_s / o.avg_jct_s:.2f}x | {o.makespan_s / 3600:.0f} | {o.p95_decay:.3f} | "
            f"{o.bad_colocations} | {o.colocations} ({o.gang_colocations}) | {o.ooms} | {o.gang_share:.2f} | "
            f"{o.eff_util_one_gpu:.3f} | {o.eff_util_gangs:.3f} |"
        )
    return "\n".join(lines)
