"""Reading the series back through Prometheus' HTTP API (PromQL), time-boxed: a Prometheus that is down, slow or
answers garbage raises ``MetricsUnavailable`` within ``timeout_s`` and never stalls its caller.

The interface other packages use (governance's idle GPU detection among them) is ``job_gpu_utilisation``."""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass

MAX_RESPONSE_BYTES = 32 * 1024 * 1024


class MetricsUnavailable(Exception):
    """No answer from Prometheus; the message says why (shown where a view has no data)."""


@dataclass(frozen=True)
class GpuUtilisation:
    """One GPU a job held over the window: its mean utilisation (percent) and how many samples that mean is of."""

    job: str
    node: str
    gpu: str
    mean_percent: float
    samples: int


class Prometheus:
    def __init__(self, url: str, timeout_s: float = 2.0, budget_s: float | None = None) -> None:
        """``timeout_s`` bounds each query; ``budget_s`` (None: no bound) all of this client's queries together, so
        a view of several queries answers within it even where each is slow but not quite timed out."""
        self.url, self.timeout_s = url.rstrip("/"), timeout_s
        self.budget_s = budget_s
        self.deadline = None if budget_s is None else time.monotonic() + budget_s

    def _get(self, path: str, params: dict[str, str]) -> list[dict]:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        timeout = self.timeout_s
        if self.deadline is not None:
            timeout = min(timeout, self.deadline - time.monotonic())
            if timeout <= 0:
                raise MetricsUnavailable(f"Prometheus at {self.url}: no answer within {self.budget_s:g} s")
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - the admin's URL
                body = json.loads(resp.read(MAX_RESPONSE_BYTES + 1)[:MAX_RESPONSE_BYTES])
        except (OSError, ValueError) as exc:  # refused, timed out (socket timeout is an OSError), not JSON
            raise MetricsUnavailable(f"Prometheus at {self.url}: {exc}") from exc
        if not isinstance(body, dict) or body.get("status") != "success":
            raise MetricsUnavailable(f"Prometheus at {self.url} answered no result")
        result = (body.get("data") or {}).get("result")
        if not isinstance(result, list) or not all(isinstance(r, dict) and "metric" in r for r in result):
            raise MetricsUnavailable(f"Prometheus at {self.url} answered an unreadable result")
        return result

    def instant(self, promql: str, at: float | None = None) -> list[dict]:
        params = {"query": promql} | ({"time": str(at)} if at is not None else {})
        return self._get("/api/v1/query", params)

    def range(self, promql: str, start: float, end: float, step_s: float) -> list[dict]:
        params = {"query": promql, "start": str(start), "end": str(end), "step": str(step_s)}
        return self._get("/api/v1/query_range", params)

    def job_gpu_utilisation(self, window_s: int, at: float | None = None) -> list[GpuUtilisation]:
        """Per job and GPU it held, the mean utilisation over the ``window_s`` seconds before ``at`` (now)."""
        window = f"{int(window_s)}s"
        means = self.instant(f"avg_over_time(caldera_job_gpu_utilisation_percent[{window}])", at)
        counts = self.instant(f"count_over_time(caldera_job_gpu_utilisation_percent[{window}])", at)

        def key(r: dict) -> tuple[str, str, str]:
            m = r["metric"]
            return m.get("job", ""), m.get("node", ""), m.get("gpu", "")

        try:
            n = {key(r): int(float(r["value"][1])) for r in counts}
            return [GpuUtilisation(*key(r), float(r["value"][1]), n.get(key(r), 0)) for r in means]
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise MetricsUnavailable(f"Prometheus at {self.url} answered an unreadable value") from exc
