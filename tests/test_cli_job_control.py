"""The CLI's job control against a real server process: hold and release (several ids, prefixes), an admin's requeue,
dependencies (``--after``) and ``caldera accounting``."""

from __future__ import annotations

import csv
import io
import json

from tests import test_cli_sdk
from tests.conftest import wait_for
from tests.test_server_process import cli, job, token, until

sdk = test_cli_sdk.sdk  # the fixture: the admin's SDK client, logged in through the CLI

TINY = {"cpu": 0.1, "memory_mib": 64}


def _reasons(server, h, jid) -> list[str]:
    return [e["reason"] for e in job(server, h, jid)["events"]]


def test_hold_release_and_requeue(server, sdk):
    h = token(server)
    cli(server, "node", "cordon", "node-0", "--reason", "hold test")  # nothing starts while the jobs are held
    ids = [sdk.submit({"name": f"later-{i}", "command": "true", "resources": TINY})["id"] for i in range(2)]
    out = cli(server, "hold", ids[0][:7], ids[1], "--reason", "data not ready").stdout
    assert f"{ids[0]}: held" in out and f"{ids[1]}: held" in out
    cli(server, "node", "uncordon", "node-0")
    why = cli(server, "why", ids[0]).stdout
    assert "Held" in why and "held by admin: data not ready" in why
    wait_for(lambda: "Held" in _reasons(server, h, ids[1]), 10, what="the hold's event")
    assert job(server, h, ids[0])["state"] == "Queued"
    assert cli(server, "hold", "nosuchjob", check=False).returncode == 1

    cli(server, "release", *ids)
    assert until(server, h, ids[0], {"Succeeded"}) and until(server, h, ids[1], {"Succeeded"})
    assert cli(server, "hold", ids[0], check=False).returncode == 1  # it has ended

    running = cli(server, "run", "--name", "long", "--", "sleep", "120").stdout.split("submitted ")[1].split()[0]
    until(server, h, running, {"Running"})
    out = cli(server, "admin", "requeue", running, "--reason", "node swap").stdout
    assert "requeued" in out
    wait_for(lambda: "Requeued" in _reasons(server, h, running), 60, what="the requeue")
    assert "RequeuedByAdmin" in _reasons(server, h, running)
    assert until(server, h, running, {"Running"})["attempt"] == 2
    cli(server, "cancel", running)
    until(server, h, running, {"Cancelled"})
    assert json.loads(cli(server, "describe", running, "-o", "json").stdout)["hold"] is None


def _run(server, *args) -> str:
    return cli(server, "run", *args).stdout.split("submitted ")[1].split()[0]


def test_run_after_a_job(server, sdk):
    h = token(server)
    first = _run(server, "--name", "first", "--", "sleep", "20")
    dry = cli(server, "run", "--dry-run", "--after", f"{first[:6]}:any", "--", "true").stdout
    assert f"job: {first}" in dry and "when: any" in dry  # the prefix made whole
    bad = cli(server, "run", "--after", f"{first}:later", "--", "true", check=False)
    assert bad.returncode != 0 and "JOB:any" in bad.stderr
    second = _run(server, "--name", "second", "--after", first[:7], "--", "true")
    assert sdk.job(second)["spec"]["after"] == [{"job": first, "when": "ok"}]
    wait_for(lambda: "Dependency" in cli(server, "why", second).stdout, 20, what="the dependency's reason")
    assert f"waiting for job {first} to end" in cli(server, "why", second).stdout
    done = until(server, h, second, {"Succeeded"})
    assert done["started_at"] >= job(server, h, first)["finished_at"]


def test_accounting_table_json_and_csv(server, sdk):
    h = token(server)
    done = _run(server, "--name", "counted", "--", "true")
    until(server, h, done, {"Succeeded"})
    rows = list(csv.DictReader(io.StringIO(cli(server, "accounting", "--since", "1d", "--csv").stdout)))
    assert [r["id"] for r in rows] == [done]
    assert rows[0]["user"] == "admin" and rows[0]["state"] == "Succeeded" and rows[0]["end"].endswith("+00:00")
    assert float(rows[0]["gpu_hours"]) == 0
    assert json.loads(cli(server, "accounting", "-o", "json").stdout)["jobs"] == sdk.accounting()["jobs"]
    table = cli(server, "accounting").stdout
    assert done in table and "1 jobs" in table
    bad = cli(server, "accounting", "--since", "forever", check=False)
    assert bad.returncode == 1 and "since" in bad.stderr
