"""Governance's inputs from Prometheus: each running job's GPU utilisation samples as Prometheus stored them (their
own timestamps, so a gap in the metrics stays a gap: a range query would fill it with the last value for five
minutes), and what a finished job used, for advice."""

from __future__ import annotations

import re

from caldera.governance.advice import GpuUse, JobUse
from caldera.governance.decide import Series
from caldera.metrics.query import MetricsUnavailable, Prometheus

SERIES = "caldera_job_gpu_utilisation_percent"
_JOB_ID = re.compile(r"[a-z0-9-]{1,32}")  # our ids; checked before one goes into a query


def job_gpu_samples(
    prom: Prometheus, span_s: float, jobs: list[str], at: float | None = None
) -> dict[str, dict[str, Series]]:
    """job id -> "node/gpu" -> its samples over the ``span_s`` seconds before ``at`` (now), oldest first, for
    ``jobs`` only. ``MetricsUnavailable`` when Prometheus does not answer or answers something unreadable."""
    ids = "|".join(j for j in jobs if _JOB_ID.fullmatch(j))
    result = prom.instant(f'{SERIES}{{job=~"{ids}"}}[{max(1, int(span_s))}s]', at)
    out: dict[str, dict[str, Series]] = {}
    try:
        for r in result:
            m = r["metric"]
            points = sorted((float(t), float(v)) for t, v in r.get("values") or [])
            out.setdefault(m.get("job", ""), {})[f"{m.get('node', '')}/{m.get('gpu', '')}"] = points
    except (TypeError, ValueError) as exc:
        raise MetricsUnavailable(f"Prometheus at {prom.url} answered unreadable samples") from exc
    return out


def job_use(prom: Prometheus, job_id: str, start: float, end: float, gpus_asked: int, cpu_asked: float) -> JobUse:
    """What a finished job used over [start, end], from its series (``MetricsUnavailable`` when unreadable)."""
    if not _JOB_ID.fullmatch(job_id):
        raise ValueError(f"not a job id: {job_id!r}")
    span = f"{max(1, int(end - start))}s"
    sel = f'{{job="{job_id}"}}'

    def per_gpu(promql: str) -> dict[tuple[str, str], float]:
        try:
            return {(r["metric"].get("node", ""), r["metric"].get("gpu", "")): float(r["value"][1])
                    for r in prom.instant(promql, end)}  # fmt: skip
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise MetricsUnavailable(f"Prometheus at {prom.url} answered an unreadable value") from exc

    means = per_gpu(f"avg_over_time(caldera_job_gpu_utilisation_percent{sel}[{span}])")
    counts = per_gpu(f"count_over_time(caldera_job_gpu_utilisation_percent{sel}[{span}])")
    peaks = per_gpu(f"max_over_time(caldera_job_gpu_memory_used_bytes{sel}[{span}])")
    totals = per_gpu(f"max_over_time(caldera_gpu_memory_total_bytes[{span}])")
    cpu = per_gpu(
        f"max_over_time(caldera_job_cpu_seconds{sel}[{span}]) - min_over_time(caldera_job_cpu_seconds{sel}[{span}])"
    )
    gpus = [
        GpuUse(mean, peaks.get(key, 0.0), totals.get(key, 0.0), int(counts.get(key, 0))) for key, mean in means.items()
    ]
    cores = sum(cpu.values()) / max(1.0, end - start) if cpu else None
    return JobUse(gpus_asked, cpu_asked, gpus, cores)
