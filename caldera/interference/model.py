"""The decay model: solo-profile features plus what training saw of each job, fed to a regressor.

Besides the pure features of :mod:`.features`, the model remembers from its training samples how much each job
type (and each model family, and each family pair) *suffers* next to others and how much it *inflicts* on others,
per GPU type and over all of them. Those encodings are missing (NaN) for anything training never saw, which is what
a held-out pair or family looks like; the training rows get them out-of-fold, grouped by family pair, so the
regressor learns how far to trust them. The estimator only needs ``fit``/``predict`` (scikit-learn's, offline).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from caldera.interference.features import feature_names, mix_features
from caldera.interference.records import JobType, Profile, Sample

Key = tuple[str, ...]


def _encoding_keys(s: Sample) -> dict[str, list[Key]]:
    """Which table entries a sample updates / reads, by encoding name."""
    co = s.corunners
    return {
        "suffer_job_gpu": [(s.target.key, s.gpu)],
        "suffer_job": [(s.target.key,)],
        "suffer_family": [(s.target.family,)],
        "inflict_job_gpu": [(c.key, s.gpu) for c in co],
        "inflict_job": [(c.key,) for c in co],
        "inflict_family": [(c.family,) for c in co],
        "pair_job": [(s.target.key, *sorted(c.key for c in co))],
        "pair_family_gpu": [(s.target.family, *sorted(c.family for c in co), s.gpu)],
    }


ENCODINGS = tuple(_encoding_keys(Sample("g", JobType("a", 0), (JobType("b", 0),), 0.0)))


def fit_tables(samples: Sequence[Sample]) -> dict[str, dict[Key, float]]:
    sums: dict[str, dict[Key, list[float]]] = {e: defaultdict(lambda: [0.0, 0.0]) for e in ENCODINGS}
    for s in samples:
        for enc, keys in _encoding_keys(s).items():
            for k in keys:
                acc = sums[enc][k]
                acc[0] += s.decay
                acc[1] += 1
    return {e: {k: a[0] / a[1] for k, a in t.items()} for e, t in sums.items()}


def encode(s: Sample, tables: dict[str, dict[Key, float]]) -> list[float]:
    out = []
    for enc, keys in _encoding_keys(s).items():
        vals = [tables[enc][k] for k in keys if k in tables[enc]]
        out.append(float(np.mean(vals)) if len(vals) == len(keys) else float("nan"))
    return out


def pair_group(s: Sample) -> str:
    """The unordered set of model families in a sample's mix."""
    return "+".join(sorted({s.target.family, *(c.family for c in s.corunners)}))


@dataclass(slots=True)
class DecayModel:
    estimator: Any
    feature_set: str = "profile"
    use_encodings: bool = True
    families: list[str] = field(default_factory=list)
    tables: dict[str, dict[Key, float]] = field(default_factory=dict)

    @property
    def features(self) -> list[str]:
        return feature_names(self.feature_set) + (list(ENCODINGS) if self.use_encodings else [])

    def rows(
        self, samples: Sequence[Sample], profiles: dict[JobType, Profile], tables: dict[str, dict[Key, float]]
    ) -> np.ndarray:
        out = []
        for s in samples:
            row = mix_features(
                profiles[s.target], [profiles[c] for c in s.corunners], s.gpu, self.feature_set, families=self.families
            )
            if self.use_encodings:
                row += encode(s, tables)
            out.append(row)
        return np.asarray(out, dtype=float).reshape(len(samples), len(self.features))

    def fit(self, samples: Sequence[Sample], profiles: dict[JobType, Profile], folds: int = 5) -> DecayModel:
        self.families = sorted({p.job.family for p in profiles.values()})
        self.tables = fit_tables(samples) if self.use_encodings else {}
        X = self.rows(samples, profiles, self.tables)
        if self.use_encodings:
            self._out_of_fold(samples, X, folds)
        self.estimator.fit(X, np.array([s.decay for s in samples]))
        return self

    def _out_of_fold(self, samples: Sequence[Sample], X: np.ndarray, folds: int) -> None:
        """Training rows' encodings from the other folds: half the rows grouped by family pair (as a held-out pair
        looks), half at random (as a seen pair on another GPU or batch size looks)."""
        n_base = len(feature_names(self.feature_set))
        rng = np.random.default_rng(0)
        groups = sorted({pair_group(s) for s in samples})
        fold_of_group = {g: int(f) for g, f in zip(groups, rng.permutation(len(groups)) % folds)}
        by_pair = np.array([fold_of_group[pair_group(s)] for s in samples])
        at_random = rng.permutation(len(samples)) % folds
        grouped = rng.random(len(samples)) < 0.5
        for assign, mine in ((by_pair, grouped), (at_random, ~grouped)):
            for f in range(folds):
                tables = fit_tables([s for s, k in zip(samples, assign) if k != f])
                for i in np.flatnonzero((assign == f) & mine):
                    X[i, n_base:] = encode(samples[i], tables)

    def predict_samples(self, samples: Sequence[Sample], profiles: dict[JobType, Profile]) -> np.ndarray:
        if not samples:
            return np.zeros(0)
        return np.clip(self.estimator.predict(self.rows(samples, profiles, self.tables)), 0.0, 1.0)
