"""Observability (issue 25): a node agent samples GPUs through a metric source and jobs through /proc and their
cgroup, exposes them in the Prometheus text format, and the platform reads them back through Prometheus' HTTP API
(``caldera.metrics.query``). docs/metrics.md describes the series, the views and the query interface."""
