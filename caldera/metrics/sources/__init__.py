"""Metric sources by name (setting ``metrics_source``), registered as entry points in the ``caldera.metric_sources``
group like runtimes: a site's own source (a DCGM exporter, say) is a package that declares one.

A source is a class taking the platform's Settings; it imports its own client libraries lazily."""

from __future__ import annotations

from importlib.metadata import entry_points

from caldera.config import Settings
from caldera.metrics.sources.base import MetricSource, SourceUnavailable

GROUP = "caldera.metric_sources"


def available() -> list[str]:
    return sorted(ep.name for ep in entry_points(group=GROUP))


def create_source(settings: Settings) -> MetricSource:
    """The source named by ``settings.metrics_source``; ``SourceUnavailable`` when none is installed by that name or
    it cannot start here (no NVML library, no driver)."""
    found = [ep for ep in entry_points(group=GROUP) if ep.name == settings.metrics_source]
    if not found:
        raise SourceUnavailable(
            f"unknown metric source {settings.metrics_source!r}; installed: {', '.join(available())}"
        )
    try:
        return found[0].load()(settings)
    except SourceUnavailable:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever a source's start-up raises, the caller needs one type
        raise SourceUnavailable(f"metric source {settings.metrics_source!r} cannot start here: {exc}") from exc
