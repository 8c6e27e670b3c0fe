"""Training and evaluation of the decay model (offline; needs scikit-learn, the optional extra ``interference``).

Splits, each reported as MSE, MAE and R² over the out-of-fold predictions:

* ``random``: 5-fold over samples.
* ``pair``: 5-fold grouped by the unordered pair of model families, so a test family pair (e.g. ResNet-50 next to
  LM, at any batch size, either way round, on any GPU) never appears in training.
* ``family``: leave one model family out: train on the samples that do not involve it at all, test on those
  that do (as target or as co-runner).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from caldera.interference.model import DecayModel, pair_group
from caldera.interference.records import Dataset, Sample

SPLITS = ("random", "pair", "family")


def _models() -> dict[str, Callable[[], Any]]:
    from sklearn.ensemble import (
        AdaBoostRegressor,
        ExtraTreesRegressor,
        GradientBoostingRegressor,
        HistGradientBoostingRegressor,
        RandomForestRegressor,
    )
    from sklearn.impute import SimpleImputer
    from sklearn.linear_model import BayesianRidge, LinearRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import SVR

    def scaled(est: Any) -> Any:  # models without native missing-value support: impute, then standardise
        return make_pipeline(SimpleImputer(strategy="mean", keep_empty_features=True), StandardScaler(), est)

    return {
        "random_forest": lambda: RandomForestRegressor(n_estimators=200, random_state=0, n_jobs=1),
        "gradient_boosting": lambda: make_pipeline(
            SimpleImputer(keep_empty_features=True), GradientBoostingRegressor(random_state=0)
        ),
        "svr": lambda: scaled(SVR(C=1.0, epsilon=0.02)),
        "linear": lambda: scaled(LinearRegression()),
        "bayesian_ridge": lambda: scaled(BayesianRidge()),
        "adaboost": lambda: make_pipeline(
            SimpleImputer(keep_empty_features=True), AdaBoostRegressor(random_state=0, n_estimators=100)
        ),
        "hist_gradient_boosting": lambda: HistGradientBoostingRegressor(random_state=0, max_iter=300),
        "extra_trees": lambda: ExtraTreesRegressor(n_estimators=300, min_samples_leaf=2, random_state=0, n_jobs=1),
    }


def model_names() -> list[str]:
    return list(_models())


def make_model(name: str) -> Any:
    try:
        return _models()[name]()
    except KeyError:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(_models())}") from None


def new_decay_model(model: str, feature_set: str) -> DecayModel:
    """``feature_set`` is ``identity`` (the baseline: no encodings), ``profile`` or ``profile+enc``."""
    base, _, enc = feature_set.partition("+")
    return DecayModel(make_model(model), base, use_encodings=enc == "enc")


def families(ds: Dataset) -> list[str]:
    return sorted({j.family for j in ds.profiles})


def folds(ds: Dataset, split: str, seed: int = 0) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(train indices, test indices) of each fold of ``split`` over ``ds.samples``."""
    from sklearn.model_selection import GroupKFold, KFold

    n = len(ds.samples)
    idx = np.arange(n)
    if split == "random":
        yield from KFold(5, shuffle=True, random_state=seed).split(idx)
    elif split == "pair":
        groups = [pair_group(s) for s in ds.samples]
        yield from GroupKFold(5, shuffle=True, random_state=seed).split(idx, groups=groups)
    elif split == "family":
        involved = [{s.target.family, *(c.family for c in s.corunners)} for s in ds.samples]
        for fam in families(ds):
            test = np.array([fam in inv for inv in involved])
            yield idx[~test], idx[test]
    else:
        raise ValueError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")


@dataclass(slots=True)
class Score:
    model: str
    feature_set: str
    split: str
    mse: float
    mae: float
    r2: float
    seconds: float


def cross_validate(ds: Dataset, model: str, feature_set: str, split: str, seed: int = 0) -> Score:
    from sklearn.metrics import mean_absolute_error, mean_squared_error, r2_score

    t0 = time.perf_counter()
    truth: list[np.ndarray] = []
    pred: list[np.ndarray] = []
    for train, test in folds(ds, split, seed):
        m = new_decay_model(model, feature_set).fit([ds.samples[i] for i in train], ds.profiles)
        test_samples = [ds.samples[i] for i in test]
        truth.append(np.array([s.decay for s in test_samples]))
        pred.append(m.predict_samples(test_samples, ds.profiles))
    yt, yp = np.concatenate(truth), np.concatenate(pred)
    return Score(
        model,
        feature_set,
        split,
        float(mean_squared_error(yt, yp)),
        float(mean_absolute_error(yt, yp)),
        float(r2_score(yt, yp)),
        time.perf_counter() - t0,
    )


def train(
    ds: Dataset, model: str, feature_set: str, *, source: str = "", samples: Sequence[Sample] | None = None
) -> Any:
    """A :class:`~caldera.interference.store.ModelFile` trained on ``samples`` (all of ``ds`` by default)."""
    import sklearn

    from caldera.interference.store import ModelFile

    rows = list(ds.samples if samples is None else samples)
    m = new_decay_model(model, feature_set).fit(rows, ds.profiles)
    meta: dict[str, Any] = {
        "trained_at": time.time(),
        "source": source,
        "samples": len(rows),
        "estimator": model,
        "feature_set": feature_set,
        "sklearn": sklearn.__version__,
    }
    return ModelFile(m, dict(ds.profiles), meta)
