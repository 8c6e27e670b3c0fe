"""What a replay measured.

* JCT (job completion time) = finish - submit, over completed jobs.
* Queueing delay = first start - submit, over jobs that started.
* Makespan = last finish - first submit.
* GPU allocation rate = allocated GPUs / cluster GPUs, a step function of time; its mean is time-weighted over
  ``[first submit, end of replay]``. GPUs of a preempted job still in its grace period count as allocated.
* Fairness: **Jain's index over accounts of the mean bounded slowdown**. A job's bounded slowdown (Feitelson) is
  ``max(1, JCT / max(duration, tau))`` with ``tau = 10 s``, so seconds-long jobs do not dominate; ``x_a`` is its
  mean over account ``a``'s completed jobs, and ``J = (sum x_a)^2 / (n * sum x_a^2)`` over the ``n`` accounts with
  completed jobs. ``J = 1`` when every account's jobs are slowed down equally; ``J = 1/n`` when one account bears
  all the slowdown. It is a measure of equal treatment (in slowdown), not of absolute speed: compare it together
  with the JCT figures.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from caldera.sim.simulator import SimResult

BSLD_TAU_S = 10.0


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index ``(sum x)^2 / (n * sum x^2)`` of non-negative values: 1 when all are equal, ``1/n``
    when a single one is non-zero. 1.0 for an empty or all-zero input (nothing is unequal)."""
    x = np.asarray(list(values), dtype=float)
    if x.size == 0:
        return 1.0
    if np.any(x < 0):
        raise ValueError("Jain's index is defined for non-negative values")
    sq = float(np.dot(x, x))
    if sq == 0.0:
        return 1.0
    return float(x.sum() ** 2 / (x.size * sq))


def bounded_slowdown(jct: np.ndarray, duration: np.ndarray, tau: float = BSLD_TAU_S) -> np.ndarray:
    return np.maximum(1.0, jct / np.maximum(duration, tau))


def _stats(x: np.ndarray) -> dict[str, float | None]:
    if x.size == 0:
        return {"mean": None, "p50": None, "p95": None, "p99": None, "max": None}
    p50, p95, p99 = np.percentile(x, [50, 95, 99])
    return {"mean": float(x.mean()), "p50": float(p50), "p95": float(p95), "p99": float(p99), "max": float(x.max())}


def time_weighted_mean(t: Sequence[float], v: Sequence[float], start: float, end: float) -> float:
    """Mean of the step function that is ``v[i]`` on ``[t[i], t[i+1])`` (the last step lasts until ``end``)."""
    if end <= start or not len(t):
        return float(v[-1]) if len(v) else 0.0
    ta = np.clip(np.append(np.asarray(t, dtype=float), end), start, end)
    dt = np.diff(ta)
    return float(np.dot(dt, np.asarray(v, dtype=float)) / (end - start))


def resample_steps(
    t: Sequence[float], v: Sequence[float], start: float, end: float, points: int = 500
) -> tuple[list[float], list[float]]:
    """The step function averaged over ``points`` equal bins of ``[start, end]``: bin start times and means."""
    if end <= start or not len(t):
        return [float(start)], [float(v[-1]) if len(v) else 0.0]
    ts = np.asarray(t, dtype=float)
    vs = np.asarray(v, dtype=float)
    edges = np.linspace(start, end, points + 1)
    # integral of the step function up to each edge
    seg_end = np.append(ts[1:], end)
    cum = np.concatenate([[0.0], np.cumsum(vs * np.clip(seg_end - ts, 0, None))])
    idx = np.clip(np.searchsorted(ts, edges, side="right") - 1, 0, len(ts) - 1)
    at_edge = cum[idx] + vs[idx] * np.clip(edges - ts[idx], 0, None)
    at_edge[edges < ts[0]] = 0.0
    means = np.diff(at_edge) / np.diff(edges)
    return edges[:-1].tolist(), means.tolist()


def job_arrays(result: SimResult) -> dict[str, np.ndarray]:
    """Per-job arrays (NaN where a job did not start / finish)."""
    jobs = result.jobs
    nan = math.nan
    return {
        "submit": np.fromiter((j.trace.submit_time_s for j in jobs), float, len(jobs)),
        "duration": np.fromiter((j.trace.duration_s for j in jobs), float, len(jobs)),
        "gpus": np.fromiter((j.gpus for j in jobs), float, len(jobs)),
        "start": np.fromiter((nan if j.first_start is None else j.first_start for j in jobs), float, len(jobs)),
        "finish": np.fromiter((nan if j.finish is None else j.finish for j in jobs), float, len(jobs)),
        "preemptions": np.fromiter((j.preemptions for j in jobs), float, len(jobs)),
    }


def compute_metrics(
    result: SimResult, series_points: int = 500, tau: float = BSLD_TAU_S, cdf_points: int = 200
) -> dict[str, Any]:
    """The JSON-able summary of one replay (see the module docstring for definitions)."""
    a = job_arrays(result)
    done = ~np.isnan(a["finish"])
    started = ~np.isnan(a["start"])
    jct = (a["finish"] - a["submit"])[done]
    wait = (a["start"] - a["submit"])[started]
    first = float(a["submit"].min()) if len(result.jobs) else 0.0
    last_finish = float(a["finish"][done].max()) if done.any() else first
    end = max(result.end_time, last_finish)

    bsld = bounded_slowdown(jct, a["duration"][done], tau)
    accounts = np.array([j.sj.account for j in result.jobs], dtype=object)[done]
    per_account: dict[str, dict[str, float]] = {}
    if accounts.size:
        names, inv = np.unique(accounts.astype(str), return_inverse=True)
        sums = np.bincount(inv, weights=bsld)
        counts = np.bincount(inv)
        jsum = np.bincount(inv, weights=jct)
        wsum = np.bincount(inv, weights=(a["start"] - a["submit"])[done])
        for k, name in enumerate(names):
            per_account[str(name)] = {
                "jobs": int(counts[k]),
                "mean_slowdown": float(sums[k] / counts[k]),
                "mean_jct_s": float(jsum[k] / counts[k]),
                "mean_wait_s": float(wsum[k] / counts[k]),
            }
    fairness = jain_index([v["mean_slowdown"] for v in per_account.values()])

    total = max(result.total_gpus, 1)
    alloc_rate = [g / total for g in result.alloc_gpus]
    series_t, series_v = resample_steps(result.alloc_t, alloc_rate, first, end, series_points)
    q_t, q_v = resample_steps(result.queue_t, result.queue_len, first, end, series_points)
    preempted_jobs = int((a["preemptions"] > 0).sum())
    return {
        "policy": result.policy,
        "cluster": result.cluster.describe(),
        "total_gpus": result.total_gpus,
        "jobs": {
            "submitted": len(result.jobs) + len(result.dropped) + result.not_arrived,
            "simulated": len(result.jobs),
            "completed": int(done.sum()),
            "unfinished": int((~done).sum()) + result.not_arrived,
            "dropped_never_fit": len(result.dropped),
        },
        "jct_s": _stats(jct),
        "queueing_delay_s": _stats(wait),
        "slowdown": _stats(bsld),
        "jct_cdf": dict(zip(("jct_s", "fraction"), _cdf(jct, cdf_points))),
        "wait_cdf": dict(zip(("wait_s", "fraction"), _cdf(wait, cdf_points))),
        "slowdown_cdf": dict(zip(("slowdown", "fraction"), _cdf(bsld, cdf_points))),
        "makespan_s": float(last_finish - first) if done.any() else 0.0,
        "gpu_allocation": {
            "mean": time_weighted_mean(result.alloc_t, alloc_rate, first, end),
            "t_s": series_t,
            "rate": series_v,
        },
        "queue_length": {
            "mean": time_weighted_mean(result.queue_t, result.queue_len, first, end),
            "max": int(max(result.queue_len)) if result.queue_len else 0,
            "t_s": q_t,
            "jobs": q_v,
        },
        "fairness": {"jain_account_slowdown": fairness, "tau_s": tau, "per_account": per_account},
        "preemptions": {
            "total": int(a["preemptions"].sum()),
            "jobs_preempted": preempted_jobs,
            "max_per_job": int(a["preemptions"].max()) if len(a["preemptions"]) else 0,
            "by_reason": dict(result.preemptions_by_reason),
        },
        "preemptions_over_time": _cumulative(result.preempt_t, first, end, series_points),
        "node_failures": {"failures": result.node_failures, "jobs_killed": result.failure_kills},
        "invalid_decisions": dict(result.invalid_decisions),
        "runtime_estimates": estimate_accuracy(result),
        "stopped": result.stopped,
        "sim": {
            "cycles": result.cycles,
            "tick_cycles": result.tick_cycles,
            "same_instant_capped": result.same_instant_capped,
            "policy_s": result.policy_s,
            "wall_s": result.wall_s,
            "end_time_s": end,
        },
    }


def _cumulative(times: Sequence[float], start: float, end: float, points: int) -> dict[str, list[float]]:
    """How many events happened by each of ``points`` evenly spaced times in [start, end]."""
    grid = np.linspace(start, max(end, start), max(points, 2))
    counts = np.searchsorted(np.sort(np.asarray(times, dtype=float)), grid, side="right")
    return {"t_s": grid.tolist(), "count": counts.astype(float).tolist()}


def _cdf(values: np.ndarray, points: int) -> tuple[list[float], list[float]]:
    """The empirical CDF sampled on a log grid: ``(x, fraction <= x)``."""
    x = np.sort(values)
    if x.size == 0:
        return [], []
    lo = max(float(x[0]), 1.0)
    grid = np.unique(np.geomspace(lo, max(float(x[-1]), lo * 1.0001), points))
    return grid.tolist(), (np.searchsorted(x, grid, side="right") / x.size).tolist()


JOB_COLUMNS = ("id", "user", "account", "queue", "gpus", "submit_s", "first_start_s", "finish_s", "duration_s",
               "preemptions", "expected_runtime_s")  # fmt: skip


def write_job_results(result: SimResult, path: str | Path) -> Path:
    """One CSV row per simulated job (times in trace seconds; empty where it never started or finished), so
    anyone can check the summary's figures."""
    path = Path(path)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(JOB_COLUMNS)
        for j in result.jobs:
            sj = j.sj
            w.writerow(
                (sj.id, sj.user, sj.account, sj.queue, j.gpus, j.trace.submit_time_s,
                 "" if j.first_start is None else j.first_start, "" if j.finish is None else j.finish,
                 j.trace.duration_s, j.preemptions, "" if j.estimate is None else round(j.estimate, 1))
            )  # fmt: skip
    return path


def estimate_accuracy(result: SimResult) -> dict[str, float | int | None]:
    """How good the run-time estimates learned from users' histories were: over jobs that had one, the median
    of estimate / actual run time, and the fractions within 2x and 10x."""
    pairs = [(j.estimate, j.trace.duration_s) for j in result.jobs if j.estimate and j.trace.duration_s > 0]
    if not pairs:
        return {"jobs": 0, "median_ratio": None, "within_2x": None, "within_10x": None}
    r = np.array([e / d for e, d in pairs])
    lr = np.abs(np.log(r))
    return {
        "jobs": len(pairs),
        "median_ratio": float(np.median(r)),
        "within_2x": float((lr <= math.log(2)).mean()),
        "within_10x": float((lr <= math.log(10)).mean()),
    }
