"""GPU sharing on Gavel's traces: exclusive FIFO vs naive packing vs interference-aware sharing
(caldera/sim/sharing_sim.py), printed as a Markdown table.

    python benchmarks/interference_sharing.py [--nodes 12] [--gpus-per-node 8] [--limit N] [--tolerance 0.45]
        [--prefer-gain 0.6]

The simulated cluster is V100; the measured V100 pairwise throughputs drive the jobs' real speeds. The scheduler
sees only the decay model's predictions; the model is trained without the V100 measurements of half the job-type
pairs (chosen at random, ``--seed``), and its error on those held-out pairs is printed first.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from caldera.config import Settings
from caldera.interference.records import gavel_path, load_gavel_pairs
from caldera.interference.train import train
from caldera.sim.sharing_sim import compare, held_out_pairs, is_held_out, load_gavel_jobs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--nodes", type=int, default=12)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--limit", type=int, default=None, help="first N jobs by arrival")
    ap.add_argument("--tolerance", type=float, default=0.45, help="decay each shared job accepts")
    ap.add_argument("--prefer-gain", type=float, default=0.6, help="share instead of a free GPU above this gain")
    ap.add_argument("--estimator", default="extra_trees")
    ap.add_argument("--seed", type=int, default=0, help="which half of the V100 pairs the model never sees")
    args = ap.parse_args()
    data = Settings().shared_data_dir if args.data_dir is None else args.data_dir
    ds = load_gavel_pairs(gavel_path(data))
    t0 = time.perf_counter()
    held_out = held_out_pairs(ds, "v100", args.seed)
    trained = [s for s in ds.samples if not is_held_out(s, held_out)]
    mf = train(ds, args.estimator, "profile+enc", samples=trained)
    test = [s for s in ds.samples if is_held_out(s, held_out)]
    err = np.abs(mf.model.predict_samples(test, ds.profiles) - np.array([s.decay for s in test]))
    print(f"decay model trained on {len(trained)} samples in {time.perf_counter() - t0:.0f} s; on the {len(test)}")
    print(f"held-out V100 samples: MAE {err.mean():.3f}, p95 error {np.percentile(err, 95):.3f}")
    jobs = load_gavel_jobs(Path(data) / "traces" / "gavel_msr_seed0", ds, limit=args.limit)
    shared = sum(1 for j in jobs if j.gpus == 1)
    print(f"{len(jobs)} jobs ({shared} one-GPU, shareable), {args.nodes} x {args.gpus_per_node} V100\n")
    outs = compare(
        ds,
        jobs,
        mf.predictor(),
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        tolerance=args.tolerance,
        prefer_gain=args.prefer_gain,
    )
    base = outs[0]
    print(
        "| policy | eff. util (busy GPU) | cluster tput | avg JCT h | JCT vs FIFO | makespan h | p95 decay | "
        "bad co-locations | co-locations | OOMs |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for o in outs:
        print(
            f"| {o.policy} | {o.eff_util_busy:.3f} | {o.cluster_throughput:.3f} | {o.avg_jct_s / 3600:.1f} | "
            f"{base.avg_jct_s / o.avg_jct_s:.2f}x | {o.makespan_s / 3600:.0f} | {o.p95_decay:.3f} | "
            f"{o.bad_colocations} | {o.colocations} | {o.ooms} |"
        )


if __name__ == "__main__":
    main()
