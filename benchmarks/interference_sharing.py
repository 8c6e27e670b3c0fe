"""GPU sharing on Gavel's traces: exclusive FIFO vs naive packing vs interference-aware sharing
(caldera/sim/sharing_sim.py via caldera/sim/sharing_experiment.py, as ``caldera sim sharing`` runs it), printed as
Markdown tables, one per split seed, then the aware policy's gains over exclusive FIFO across them.

    python benchmarks/interference_sharing.py [--nodes 6] [--limit 1500] [--skip 0] [--seeds 0,1,2]
        [--tolerance 0.45] [--prefer-gain 0.6] [--max-jobs-per-gpu 2] [--oracle] [--share-gangs]
        [--estimator auto] [--match-window 1000] [--no-drain-for-blocked] [--no-pair-on-free]

The simulated cluster is V100; the measured V100 pairwise throughputs drive the jobs' real speeds. The scheduler
sees only the decay model's predictions; the model is trained without the V100 measurements of half the job-type
pairs (chosen at random by each seed), and its error on those held-out pairs is printed first.
"""

from __future__ import annotations

import argparse

import numpy as np

from caldera.config import Settings
from caldera.sim.sharing_experiment import WHOLE_POOL, markdown_table, run_experiment


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--nodes", type=int, default=12)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--limit", type=int, default=None, help="N jobs by arrival")
    ap.add_argument("--skip", type=int, default=0, help="from the first N (another window of the traces)")
    ap.add_argument("--tolerance", type=float, default=0.45, help="decay each shared job accepts")
    ap.add_argument("--prefer-gain", type=float, default=0.6, help="share instead of a free GPU above this gain")
    ap.add_argument("--max-jobs-per-gpu", type=int, default=2)
    ap.add_argument("--estimator", default="auto", help="the decay model's regressor; auto: chosen by validation")
    ap.add_argument(
        "--match-window", type=int, default=WHOLE_POOL, help="waiting jobs placed best pair first (1: in order)"
    )
    ap.add_argument("--min-gain", type=float, default=0.0, help="share only above this predicted gain")
    ap.add_argument("--keep-order", action="store_true", help="never share past a waiting exclusive job")
    ap.add_argument(
        "--drain-for-blocked",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="no new partner on the GPUs the first blocked exclusive job (a gang) needs, so they drain",
    )
    ap.add_argument(
        "--pair-on-free",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="with --drain-for-blocked: free GPUs outside those open to a pair of waiting jobs (gain > prefer-gain)",
    )
    ap.add_argument(
        "--share-gangs",
        action="store_true",
        help="multi-GPU jobs share too, assumed to decay as their one-GPU versions (Gavel measured no gang pair)",
    )
    ap.add_argument("--oracle", action="store_true", help="also the aware policy told the measured decays")
    ap.add_argument("--seeds", default="0", help="which halves of the V100 pairs the model never sees, e.g. 0,1,2")
    args = ap.parse_args()
    data = Settings().shared_data_dir if args.data_dir is None else args.data_dir
    gains = []
    for seed in (int(s) for s in args.seeds.split(",")):
        ex = run_experiment(
            data,
            nodes=args.nodes,
            gpus_per_node=args.gpus_per_node,
            limit=args.limit,
            skip=args.skip,
            tolerance=args.tolerance,
            prefer_gain=args.prefer_gain,
            max_jobs_per_gpu=args.max_jobs_per_gpu,
            estimator=args.estimator,
            seed=seed,
            oracle=args.oracle,
            match_window=args.match_window,
            min_gain=args.min_gain,
            keep_order=args.keep_order,
            drain_for_blocked=args.drain_for_blocked,
            pair_on_free=args.pair_on_free,
            share_gangs=args.share_gangs,
        )
        print(ex.summary(), f"on {args.nodes} x {args.gpus_per_node} V100\n")
        print(markdown_table(ex.outcomes), "\n", flush=True)
        fifo, naive, aware = ex.outcomes[:3]
        gains.append(
            (aware.eff_util_busy / fifo.eff_util_busy, fifo.avg_jct_s / aware.avg_jct_s, aware.bad_colocations)
        )
    g = np.array(gains)
    print(
        f"aware vs exclusive FIFO over {len(g)} seeds: eff. util x{g[:, 0].mean():.4f} "
        f"(min {g[:, 0].min():.4f}, max {g[:, 0].max():.4f}), JCT {g[:, 1].mean():.2f}x "
        f"(min {g[:, 1].min():.2f}x), bad co-locations {g[:, 2].mean():.0f}"
    )


if __name__ == "__main__":
    main()
