"""Feature extraction for the decay model: pure functions from solo profiles to numbers (no ML stack).

The model's input is the target job's solo description and the *sum* of its co-runners' (so one model serves 2-
and 3-job mixes), plus symmetric pair features. Two feature sets:

* ``identity``: the baseline the issue names -- job identity (family code), batch size and solo throughput of the
  target and of the co-runners, and the GPU type.
* ``profile``: what generalises to jobs never seen together: each job's solo throughput on every GPU type (log),
  its speed-up across GPU types (compute- vs memory-bound), samples per second, batch size, scale factor and any
  utilisation metrics of its solo record; the co-runners' sum and the pair's sum / difference.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from caldera.interference.records import GAVEL_GPUS, Profile

FEATURE_SETS = ("identity", "profile")
# solo-record utilisation columns used when a profile has them (``caldera profile`` writes them)
METRIC_COLUMNS = ("gpu_util_avg", "sm_active_avg", "sm_occupancy_avg", "dram_util_avg", "gpu_mem_max")


def _log(x: float) -> float:
    return math.log(x) if x > 0 else 0.0


def _job_profile_vector(p: Profile, gpu: str, gpus: Sequence[str]) -> list[float]:
    here = p.solo.get(gpu, 0.0)
    logs = [_log(p.solo.get(g, 0.0)) for g in gpus]
    slowest, fastest = p.solo.get(gpus[0], 0.0), p.solo.get(gpus[-1], 0.0)
    speedup = _log(fastest / slowest) if slowest > 0 and fastest > 0 else 0.0
    bs = p.job.batch_size
    return [
        *logs,
        _log(here),
        speedup,
        _log(bs) if bs else 0.0,
        _log(here * bs) if bs else _log(here),
        float(p.job.scale_factor),
        *(float(p.metrics.get(c, 0.0)) for c in METRIC_COLUMNS),
    ]


def _profile_names(gpus: Sequence[str]) -> list[str]:
    return [
        *(f"log_solo_{g}" for g in gpus),
        "log_solo_here",
        "log_speedup",
        "log_batch",
        "log_samples_s",
        "scale_factor",
        *METRIC_COLUMNS,
    ]


def feature_names(feature_set: str, gpus: Sequence[str] = GAVEL_GPUS) -> list[str]:
    if feature_set == "identity":
        return ["gpu", "family", "batch_size", "solo", "co_family", "co_batch_size", "co_solo"]
    if feature_set == "profile":
        per_job = _profile_names(gpus)
        return [
            *(f"gpu_{g}" for g in gpus),
            *per_job,
            *(f"co_{n}" for n in per_job),
            "pair_sum_log_solo_here",
            "pair_absdiff_log_solo_here",
            "pair_sum_log_speedup",
            "n_corunners",
        ]
    raise ValueError(f"unknown feature set {feature_set!r}; choose one of {', '.join(FEATURE_SETS)}")


def mix_features(
    target: Profile,
    corunners: Sequence[Profile],
    gpu: str,
    feature_set: str,
    *,
    families: Sequence[str] = (),
    gpus: Sequence[str] = GAVEL_GPUS,
) -> list[float]:
    """The feature row for ``target`` co-located with ``corunners`` on a GPU of type ``gpu``. ``families`` is the
    model's family vocabulary (``identity`` codes a family by its position; unknown families get -1)."""
    if feature_set == "identity":
        code = {f: float(i) for i, f in enumerate(families)}
        return [
            float(gpus.index(gpu)) if gpu in gpus else -1.0,
            code.get(target.job.family, -1.0),
            float(target.job.batch_size),
            target.solo.get(gpu, 0.0),
            sum(code.get(c.job.family, -1.0) for c in corunners),
            float(sum(c.job.batch_size for c in corunners)),
            sum(c.solo.get(gpu, 0.0) for c in corunners),
        ]
    if feature_set != "profile":
        feature_names(feature_set)  # raises
    me = _job_profile_vector(target, gpu, gpus)
    co = [sum(col) for col in zip(*(_job_profile_vector(c, gpu, gpus) for c in corunners))] or [0.0] * len(me)
    here, speed = len(gpus), len(gpus) + 1  # positions of log_solo_here and log_speedup in a job vector
    return [
        *(1.0 if gpu == g else 0.0 for g in gpus),
        *me,
        *co,
        me[here] + co[here],
        abs(me[here] - co[here]),
        me[speed] + co[speed],
        float(len(corunners)),
    ]
