"""The SDK and the CLI written on it, against a real server process: inline submit, -o json|yaml, id prefixes, ls
filters, cancel of several jobs, logout, node cordon, typed errors, and the sweep of docs/sdk.md."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from caldera.client import Client, Conflict, Invalid, NotFound, Unauthorized
from tests.test_server_process import cli, token, until

DOCS = Path(__file__).resolve().parents[1] / "docs"


@pytest.fixture
def sdk(server, monkeypatch):
    cli(server, "login", "--url", server.url, "-u", "admin", "-p", "admin-password")
    monkeypatch.setenv("CALDERA_CONFIG_DIR", server.env["CALDERA_CONFIG_DIR"])
    with Client() as c:  # the CLI's credentials by default
        yield c


def test_run_inline_wait_exit_code_dry_run_and_output_formats(server, sdk):
    r = cli(server, "run", "--wait", "--name", "three", "--", "sh", "-c", "echo hello; exit 3", check=False, timeout=90)
    assert r.returncode == 3, (r.stdout, r.stderr)
    assert "hello" in r.stdout
    jid = r.stdout.split("submitted ")[1].split()[0]

    dry = cli(server, "run", "--dry-run", "--gpus", "2", "--image", "x", "--kind", "distributed", "--replicas", "2",
              "--queue", "default", "--", "python", "train.py", "--lr", "3e-4").stdout  # fmt: skip
    assert yaml.safe_load(dry) == {
        "name": "python", "kind": "distributed", "command": ["python", "train.py", "--lr", "3e-4"],
        "resources": {"gpu": 2}, "replicas": 2, "image": "x", "queue": "default", "env": {},
    }  # fmt: skip
    assert len(sdk.jobs()) == 1  # nothing was submitted

    listed = json.loads(cli(server, "ls", "-o", "json").stdout)
    assert listed == sdk.jobs()  # the API's own objects
    assert listed[0]["id"] == jid and listed[0]["exit_code"] == 3
    described = yaml.safe_load(cli(server, "describe", jid[:6], "-o", "yaml").stdout)  # a prefix
    assert described["id"] == jid and described["state"] == "Failed" and described["events"]
    assert jid in cli(server, "ls").stdout  # the whole id, never cut
    assert json.loads(cli(server, "nodes", "-o", "json").stdout)[0]["name"] == "node-0"

    assert [j["id"] for j in json.loads(cli(server, "ls", "--state", "fAiLeD", "-o", "json").stdout)] == [jid]
    assert json.loads(cli(server, "ls", "--state", "running", "-o", "json").stdout) == []
    assert json.loads(cli(server, "ls", "--queue", "elsewhere", "-o", "json").stdout) == []
    assert json.loads(cli(server, "ls", "--since", "1h", "-o", "json").stdout)[0]["id"] == jid
    bad = cli(server, "ls", "--state", "Done", check=False)
    assert bad.returncode != 0 and "Succeeded" in bad.stderr and "Queued" in bad.stderr


def test_cancel_several_by_prefix_and_name(server, sdk):
    h = token(server)
    tiny = {"cpu": 0.1, "memory_mib": 64}
    ids = [sdk.submit({"name": "sleeper", "command": "sleep 120", "resources": tiny})["id"] for _ in range(3)]
    other = sdk.submit({"name": "keeper", "command": "sleep 120", "resources": tiny})["id"]
    cli(server, "cancel", ids[0][:8], ids[1])
    assert until(server, h, ids[0], {"Cancelled"}) and until(server, h, ids[1], {"Cancelled"})
    cli(server, "cancel", "--name", "sleeper")
    assert until(server, h, ids[2], {"Cancelled"})
    assert sdk.job(other)["state"] in ("Queued", "Starting", "Running")  # the name filter spared it
    assert cli(server, "cancel", "nosuchjob", check=False).returncode == 1
    sdk.cancel(other)


def test_sdk_typed_errors_prefixes_and_the_docs_sweep(server, sdk, capsys):
    with pytest.raises(Invalid) as exc:
        sdk.submit({"name": "too-big", "command": "true", "resources": {"gpu": 64}})
    assert exc.value.status in (400, 422) and any("resources" in e["field"] for e in exc.value.errors)
    with pytest.raises(NotFound):
        sdk.job("zzzz")
    with pytest.raises(Unauthorized):
        Client(server.url, "cal_not-a-token").jobs()

    sweep = re.search(r"## A sweep from a notebook.*?```python\n(.*?)```", (DOCS / "sdk.md").read_text(), re.S)
    scope: dict = {}
    exec(sweep.group(1), scope)  # noqa: S102 - the docs' example, run as a reader would
    assert scope["results"] == {0.1: ("Succeeded", "0.9"), 0.01: ("Succeeded", "0.99"), 0.001: ("Succeeded", "0.999")}

    ids = [j["id"] for j in sdk.jobs()]
    shared = next((a[:1] for a in ids for b in ids if a != b and a[0] == b[0]), None)
    if shared:  # an ambiguous prefix names the candidates
        with pytest.raises(Conflict):
            sdk.job(shared)
    assert sdk.job(ids[0][:5])["id"] == ids[0]


def test_all_for_a_non_admin_logout_and_node_cordon(server, sdk, tmp_path):
    cli(server, "admin", "create-user", "bob", "--password", "bob-password-1")
    bob = {**server.env, "CALDERA_CONFIG_DIR": str(tmp_path / "bob")}
    sdk.submit({"name": "admins", "command": "true"})
    bob_server = type("S", (), {"env": bob})
    cli(bob_server, "login", "--url", server.url, "-u", "bob", "-p", "bob-password-1")
    r = cli(bob_server, "ls", "--all", "-o", "json")
    assert json.loads(r.stdout) == [] and "only" in r.stderr and "yours" in r.stderr
    assert cli(bob_server, "node", "cordon", "node-0", check=False).returncode == 1  # admins only
    cli(bob_server, "logout")
    assert not (tmp_path / "bob" / "credentials.json").exists()
    assert cli(bob_server, "ls", check=False).returncode == 1

    cli(server, "node", "cordon", "node-0", "--reason", "fan")
    held = sdk.submit({"name": "held", "command": "true"})["id"]
    why = json.loads(cli(server, "why", held[:7], "-o", "json").stdout)
    assert why["state"] == "Queued"
    cli(server, "node", "uncordon", "node-0")
    assert until(server, token(server), held, {"Succeeded"})
