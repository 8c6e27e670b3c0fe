"""`caldera top` and `caldera usage --since` against `caldera up` with its agent and the real Prometheus: a job that
loads a fake GPU is in the live table with its utilisation, and its GPU-hours come out as a table, JSON, CSV and a
plot, and as the low-utilisation list (`--idle`); `caldera usage` without --since is still the queues' usage
against their caps."""

from __future__ import annotations

import csv
import io
import json
import re

import httpx
import pytest

from caldera.client import Client
from tests.conftest import wait_for
from tests.test_metrics_browser import LOAD, metered  # noqa: F401 - the fixture: `caldera up` with Prometheus
from tests.test_server_process import cli, token, until

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def test_top_and_usage_show_a_job_loading_a_fake_gpu(metered, tmp_path, monkeypatch):  # noqa: F811
    server, prom = metered
    admin = token(server)
    r = httpx.post(
        server.url + "/api/v1/jobs", json={"name": "load", "command": LOAD, "resources": {"gpu": 1}}, headers=admin
    )
    jid = r.json()["id"]
    until(server, admin, jid, {"Running"})
    wait_for(
        lambda: [u for u in prom.job_gpu_utilisation(60) if u.job == jid and u.samples >= 3],
        60,
        what="the job's GPU series in Prometheus",
    )
    cli(server, "login", "--url", server.url, "-u", "admin", "-p", "admin-password")

    top = cli(server, "top", "--once").stdout
    (row,) = [line for line in top.splitlines() if jid in line]
    assert "node-0" in row and "admin" in row and "75%" in row
    assert "a100: 1/2 free, held 75% busy" in top

    listed = json.loads(cli(server, "usage", "--since", "1d", "-o", "json").stdout)
    (today,) = listed["days"]
    assert today["user"] == "admin" and today["used_gpu_hours"] > 0
    table = cli(server, "usage", "--since", "1d", "--by", "queue").stdout
    # used / allocated: the job loads its GPU at 75%, but with a minute of samples the edges of the two integrals
    # (the allocation's first sample and the load's) weigh, more so on a loaded machine
    (row,) = [line for line in table.splitlines() if "default" in line]
    used_share = int(re.search(r"(\d+)%", row).group(1))
    assert 60 <= used_share <= 100, table
    rows = list(csv.DictReader(io.StringIO(cli(server, "usage", "--since", "1d", "-o", "csv").stdout)))
    assert [r["user"] for r in rows] == ["admin"] and float(rows[0]["allocated_gpu_hours"]) > 0
    idle = cli(server, "usage", "--idle", "--since", "1d", "--by", "account").stdout  # the low-utilisation list
    (row,) = [line for line in idle.splitlines() if "default" in line]
    assert "IDLE GPU-H" in idle and re.search(r"default\s+\d+\.\d\d\s+\d+\.\d\d", row), idle
    idle_rows = list(csv.DictReader(io.StringIO(cli(server, "usage", "--idle", "--since", "1d", "-o", "csv").stdout)))
    assert [r["user"] for r in idle_rows] == ["admin"] and float(idle_rows[0]["idle_gpu_hours"]) >= 0
    plot = tmp_path / "usage.png"
    cli(server, "usage", "--since", "1d", "--plot", str(plot))
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    assert "QUEUE IN USE" in cli(server, "usage").stdout  # without --since: as before
    bad = cli(server, "usage", "-o", "csv", check=False)
    assert bad.returncode == 2 and "--since" in bad.stderr
    wrong = cli(server, "usage", "--since", "yesterday", check=False)
    assert wrong.returncode == 1 and "since" in wrong.stderr

    monkeypatch.setenv("CALDERA_CONFIG_DIR", server.env["CALDERA_CONFIG_DIR"])
    with Client() as sdk:  # the SDK's own calls, as docs/metrics.md shows them
        assert sdk.job_metrics(jid[:6])["gpu_utilisation"][0]["points"]
        assert sdk.cluster_metrics("1h")["models"][0]["model"] == "a100"
        assert sdk.node_metrics("node-0", "1h")["holders"][0]["job"] == jid
        assert sdk.gpu_hours_csv("1d").startswith("day,user,allocated_gpu_hours,used_gpu_hours")
    httpx.post(f"{server.url}/api/v1/jobs/{jid}/cancel", headers=admin)
