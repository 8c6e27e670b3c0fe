"""The pure parts of the metrics views: what ``since`` accepts, the chart window, label values quoted as data in
PromQL, and the spans a GPU was held over."""

from __future__ import annotations

import pytest

from caldera.metrics import views


def test_since_is_a_duration_or_a_utc_date():
    now = 1_800_000_000.0
    assert views.parse_since("7d", now) == now - 7 * 86400
    assert views.parse_since("12h", now) == now - 12 * 3600
    assert views.parse_since("2w", now) == now - 14 * 86400
    assert views.parse_since("2026-12-01", now) == 1796083200.0
    for bad in ("yesterday", "7", "-1d", "2026-13-01", "1d; drop", "\x00"):
        with pytest.raises(ValueError, match="neither a duration"):
            views.parse_since(bad, now)


def test_a_chart_ends_now_with_about_240_points_no_finer_than_the_scrape():
    now = 1_800_000_123.4
    start, end, step = views.window(now - 30 * 86400, now, 5)
    assert end == now and step == 10800 and (end - start) / step == 240
    start, end, step = views.window(now - 60, now, 5)
    assert step == 5 and end - start == 60


def test_label_values_stay_data_in_promql():
    hostile = 'x"} or vector(1) or {a="\\'
    sel = views.selector(job=hostile, user=None)
    assert sel == '{job="x\\"} or vector(1) or {a=\\"\\\\"}'
    assert views.selector(job="a\nb") == '{job="a\\nb"}'


def test_spans_split_where_a_gpu_was_not_held_for_longer_than_a_step():
    assert views.spans([0, 10, 20, 50, 60], 10) == [(0, 20), (50, 60)]
    assert views.spans([], 10) == []


class _PrometheusWithoutRules:
    """A site's Prometheus that never loaded Caldera's recording rules: their series are empty."""

    def __init__(self):
        self.asked: list[str] = []

    def range(self, promql, start, end, step):
        self.asked.append(promql)
        if "__name__" in promql:
            return []
        return [{"metric": {"gpu_model": "a100"}, "values": [[end, "3"]]}]

    def instant(self, promql, at=None):
        return []


def test_a_long_chart_without_the_recorded_series_reads_the_raw_ones():
    prom = _PrometheusWithoutRules()
    view = views.cluster(prom, 0, 30 * 86400, 5, None)
    assert view["recorded"] is False and view["models"][0]["total"] == [[30 * 86400, 3.0]]
    (recorded,) = [q for q in prom.asked if "__name__" in q]  # every recorded series in one query
    assert all(name in recorded for name in views.RULES)
    assert set(prom.asked) - {recorded} == set(views.RULES.values())  # then the raw ones
