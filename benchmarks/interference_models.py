"""Decay-model comparison on Gavel's pairwise throughputs: MSE, MAE and R² for the random, pair-grouped and
family-grouped splits (see caldera/interference/train.py), printed as a Markdown table.

    python benchmarks/interference_models.py [--data-dir ../shared/data] [--quick]

The first row is the baseline the issue names (a random forest on job identity, batch size and solo throughput).
"""

from __future__ import annotations

import argparse
import sys

from caldera.config import Settings
from caldera.interference.records import gavel_path, load_gavel_pairs
from caldera.interference.train import SPLITS, cross_validate, model_names

BASELINE = [("random_forest", "identity")]
ABLATION = [("extra_trees", "profile"), ("hist_gradient_boosting", "profile")]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--quick", action="store_true", help="baseline and extra trees only")
    ap.add_argument("--only", nargs="*", default=None, help="just these models (with profile+enc)")
    args = ap.parse_args()
    ds = load_gavel_pairs(gavel_path(args.data_dir or Settings().shared_data_dir))
    combos = BASELINE + (
        [("extra_trees", "profile+enc")] if args.quick else ABLATION + [(m, "profile+enc") for m in model_names()]
    )
    if args.only:
        combos = [(m, "profile+enc") for m in args.only]
    print(f"{len(ds.samples)} samples (ordered pairs x GPU type), {len(ds.infeasible)} infeasible mixes left out\n")
    head = " | ".join(f"{sp} MSE | {sp} MAE | {sp} R²" for sp in SPLITS)
    print(f"| model | features | {head} |")
    print("|---|---|" + "---:|" * (3 * len(SPLITS)))
    for model, fs in combos:
        cells = []
        for sp in SPLITS:
            sc = cross_validate(ds, model, fs, sp)
            cells += [f"{sc.mse:.4f}", f"{sc.mae:.4f}", f"{sc.r2:.3f}"]
        print(f"| {model} | {fs} | " + " | ".join(cells) + " |", flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
