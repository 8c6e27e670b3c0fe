"""The CLI's governance verbs against a real server process: a user asks to extend their job, their account's
admin (named with `caldera admin account-admin`) approves it, both see the decision."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.conftest import ServerProcess, free_port, kill_job_processes, server_env, traversable
from tests.test_server_process import cli, token, until


@pytest.fixture
def server(tmp_path, db_url):
    """conftest's server, with ports of its own for the metrics agent and Prometheus (others may hold 8651/8652)."""
    env = {**server_env(tmp_path, db_url), "CALDERA_METRICS_PORT": str(free_port()),
           "CALDERA_PROMETHEUS_PORT": str(free_port())}  # fmt: skip
    srv = ServerProcess(traversable(tmp_path) / "data", free_port(), env)
    srv.start()
    yield srv
    srv.stop()
    kill_job_processes(srv.data_dir)


def test_extend_request_is_asked_listed_and_approved_from_the_cli(server, tmp_path):
    h = token(server)
    for username in ("ann", "bob"):
        body = {"username": username, "password": "password-123", "accounts": ["default"]}
        assert httpx.post(f"{server.url}/api/v1/users", json=body, headers=h).status_code == 201
    cli(server, "login", "--url", server.url, "-u", "admin", "-p", "admin-password")
    cli(server, "admin", "account-admin", "default", "bob")
    cli(server, "login", "--url", server.url, "-u", "ann", "-p", "password-123")
    out = cli(server, "run", "--name", "long", "--", "sleep", "120").stdout
    jid = out.split("submitted ")[1].split()[0]
    until(server, token(server, "ann", "password-123"), jid, {"Running"})
    bad = cli(server, "request", "extend", jid, "--for", "soon", "--reason", "x", check=False)
    assert bad.returncode != 0 and "12h" in bad.stderr
    out = cli(server, "request", "extend", jid[:6], "--for", "2d", "--reason", "the last epochs").stdout
    assert "waiting for a decision" in out
    (mine,) = json.loads(cli(server, "request", "ls", "-o", "json").stdout)
    assert (mine["job"], mine["seconds"], mine["state"]) == (jid, 2 * 86400, "pending")
    denied = cli(server, "request", "approve", str(mine["id"]), check=False)  # not one's own
    assert denied.returncode == 1 and "403" in denied.stderr
    cli(server, "login", "--url", server.url, "-u", "bob", "-p", "password-123")
    assert str(mine["id"]) in cli(server, "request", "ls", "--pending").stdout
    assert "approved" in cli(server, "request", "approve", str(mine["id"]), "--note", "ok").stdout
    cli(server, "login", "--url", server.url, "-u", "ann", "-p", "password-123")
    (decided,) = json.loads(cli(server, "request", "ls", "-o", "json").stdout)
    assert (decided["state"], decided["decided_by"], decided["note"]) == ("approved", "bob", "ok")
    cli(server, "cancel", jid)
