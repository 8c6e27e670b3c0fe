"""The platform's own Prometheus: Debian's ``prometheus`` run on 127.0.0.1:``prometheus_port`` with a generated
configuration that scrapes the node agent, its data under ``<data_dir>/prometheus``, when the binary is installed
and no ``prometheus_url`` names a site's own."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

from caldera.config import Settings
from caldera.images.registry import _dies_with
from caldera.metrics import views
from caldera.metrics.query import MetricsUnavailable, Prometheus


def url(settings: Settings) -> str:
    return settings.prometheus_url or f"http://127.0.0.1:{settings.prometheus_port}"


def client(settings: Settings) -> Prometheus:
    return Prometheus(url(settings), settings.prometheus_timeout_s)


def _seconds(value: float) -> str:
    return f"{max(1, round(value))}s"


def rules(settings: Settings) -> dict:
    """The recording rules the long-range cluster chart reads (``views.RULES``), evaluated every
    ``metrics_rule_interval_s``; a site's own Prometheus loads the same file to get them (docs/metrics.md)."""
    return {
        "groups": [
            {
                "name": "caldera-cluster",
                "interval": _seconds(max(settings.metrics_rule_interval_s, settings.metrics_interval_s)),
                "rules": [{"record": name, "expr": expr} for name, expr in views.RULES.items()],
            }
        ]
    }


def config(settings: Settings, agents: list[str], rule_file: str | None = None) -> dict:
    """Scrape each agent (host:port) at the agent's own interval. ``honor_labels``: the agent's ``job`` label (a
    Caldera job) wins over Prometheus' own scrape-job label, which would otherwise rename it ``exported_job``."""
    interval = _seconds(settings.metrics_interval_s)
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [rule_file] if rule_file else [],
        "scrape_configs": [
            {"job_name": "caldera-agent", "honor_labels": True, "static_configs": [{"targets": agents}]}
        ],
    }


def start_local(
    settings: Settings, agents: list[str], binary: str = "prometheus", wait_s: float = 20.0
) -> subprocess.Popen | None:
    """Starts Prometheus when none is given by URL and the binary is installed; None otherwise."""
    if settings.prometheus_url or shutil.which(binary) is None:
        return None
    root = settings.data_dir / "prometheus"
    (root / "data").mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o700)
    conf, rule_file = root / "prometheus.yml", root / "rules.yml"
    rule_file.write_text(json.dumps(rules(settings)))  # JSON is YAML
    conf.write_text(json.dumps(config(settings, agents, str(rule_file))))
    log = open(root / "prometheus.log", "ab")  # noqa: SIM115 - the child holds it
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={conf}",
            f"--storage.tsdb.path={root / 'data'}",
            f"--storage.tsdb.retention.time={settings.metrics_retention_days}d",
            f"--web.listen-address=127.0.0.1:{settings.prometheus_port}",
        ],
        stdout=log,
        stderr=log,
        stdin=subprocess.DEVNULL,
        preexec_fn=_dies_with(os.getpid()),  # prctl only, before exec
    )
    log.close()
    deadline = time.monotonic() + wait_s
    while True:
        try:
            client(settings).instant("up")
            return proc
        except MetricsUnavailable:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise MetricsUnavailable(f"prometheus did not start; see {root / 'prometheus.log'}") from None
            time.sleep(0.2)


def view_client(settings: Settings) -> Prometheus:
    """For one view of several queries: each query time-boxed, and all of them within twice that."""
    return Prometheus(url(settings), settings.prometheus_timeout_s, budget_s=2 * settings.prometheus_timeout_s)
