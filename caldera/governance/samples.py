"""Each running job's GPU utilisation samples, as Prometheus stored them (their own timestamps, so a gap in the
metrics stays a gap: a range query would fill it with the last value for five minutes)."""

from __future__ import annotations

from caldera.governance.decide import Series
from caldera.metrics.query import MetricsUnavailable, Prometheus

SERIES = "caldera_job_gpu_utilisation_percent"


def job_gpu_samples(prom: Prometheus, span_s: float, at: float | None = None) -> dict[str, dict[str, Series]]:
    """job id -> "node/gpu" -> its samples over the ``span_s`` seconds before ``at`` (now), oldest first.
    ``MetricsUnavailable`` when Prometheus does not answer or answers something unreadable."""
    result = prom.instant(f"{SERIES}[{max(1, int(span_s))}s]", at)
    out: dict[str, dict[str, Series]] = {}
    try:
        for r in result:
            m = r["metric"]
            points = sorted((float(t), float(v)) for t, v in r.get("values") or [])
            out.setdefault(m.get("job", ""), {})[f"{m.get('node', '')}/{m.get('gpu', '')}"] = points
    except (TypeError, ValueError) as exc:
        raise MetricsUnavailable(f"Prometheus at {prom.url} answered unreadable samples") from exc
    return out
