"""A job of one user, run by a real `caldera up` as root, attacks the platform and another user's jobs.

Every attack of the security review runs from inside a job and must be refused: reading the database, the keys,
another user's run directory, workspace, process environment or lab, the admin's CLI credentials and /etc/shadow;
signalling another user's process; writing into the data directory; keeping any capability or gaining one.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT, wait_for
from tests.test_server_process import token, until

pytestmark = pytest.mark.skipif(not ROOT, reason="jobs run as their owners only under a root server")
sqlite_only = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)

ATTACK = textwrap.dedent("""
    import json, os, socket, sys
    t = json.loads(os.environ["TARGETS"])
    out = {}

    def attempt(name, fn):
        try:
            got = fn()
            out[name] = "LEAKED: " + repr(got)[:200]
        except PermissionError:
            out[name] = "denied"
        except OSError as exc:   # a target that is not there proves nothing: the test fails on it
            out[name] = "MISSING: " + repr(exc)

    attempt("database", lambda: open(t["database"], "rb").read(64))
    attempt("keys", lambda: open(t["keys"]).read())
    attempt("list data dir", lambda: os.listdir(t["data_dir"]))
    attempt("write data dir", lambda: open(os.path.join(t["data_dir"], "planted"), "w").write("x"))
    attempt("runs dir", lambda: os.listdir(t["runs"]))
    attempt("other's log", lambda: open(t["other_log"]).read())
    attempt("other's workspace", lambda: os.listdir(t["other_home"]))
    attempt("other's file", lambda: open(t["other_file"]).read())
    attempt("other's environ", lambda: open("/proc/%d/environ" % t["other_pid"], "rb").read())
    attempt("signal other", lambda: os.kill(t["other_pid"], 0))
    attempt("admin's CLI credentials", lambda: open(t["credentials"]).read())
    attempt("shadow", lambda: open("/etc/shadow").read())
    attempt("other's lab scratch", lambda: os.listdir(t["other_scratch"]))
    def lab():
        s = socket.socket(socket.AF_UNIX)
        s.connect(t["lab_socket"])
        return "connected"
    attempt("other's lab socket", lab)
    status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
    out["uid"] = os.getuid()
    out["groups"] = os.getgroups()
    out["CapEff"] = status["CapEff"].strip()
    out["CapPrm"] = status["CapPrm"].strip()
    out["NoNewPrivs"] = status["NoNewPrivs"].strip()
    out["home"] = os.environ.get("HOME")
    out["platform env"] = sorted(k for k in os.environ if k.startswith("CALDERA_") and k not in (
        "CALDERA_JOB_ID", "CALDERA_ATTEMPT", "CALDERA_PREEMPT_NOTICE", "CALDERA_ACCOUNT", "CALDERA_QUEUE",
        "CALDERA_RUN_TAG"))
    print(json.dumps(out))
""")


def _user(server, admin, name):
    r = httpx.post(server.url + "/api/v1/users", json={"username": name, "password": "password-123"}, headers=admin)
    assert r.status_code == 201, r.text
    return token(server, name, "password-123")


def _post(server, h, spec):
    spec = {"resources": {"cpu": 0.5, "memory_mib": 256}, **spec}  # all three fit on the test host's 2 CPUs
    r = httpx.post(server.url + "/api/v1/jobs", json=spec, headers=h)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _pid_file(server, jid):
    return json.loads(next((server.data_dir / "runs" / jid).rglob("rank-0.pid")).read_text())


@sqlite_only
def test_a_job_cannot_reach_the_platform_or_another_user(server, tmp_path):
    pytest.importorskip("jupyterlab")
    admin = token(server)
    alice, bob = _user(server, admin, "alice"), _user(server, admin, "bob")
    # the admin logged in with the CLI on this host: a credentials file a job must not read
    subprocess.run(
        [sys.executable, "-m", "caldera.cli.main", "login", "--url", server.url, "-u", "admin", "-p", "admin-password"],
        env=server.env,
        check=True,
        capture_output=True,
        timeout=60,
    )
    credentials = tmp_path / "cli-config" / "credentials.json"
    assert credentials.exists()

    secret = "alice-secret-" + os.urandom(8).hex()
    sleeper = _post(
        server,
        alice,
        {
            "name": "private",
            "env": {"ALICE_SECRET": secret},
            "command": ["sh", "-c", "echo $ALICE_SECRET > private.txt; sleep 300"],
        },
    )
    lab = _post(server, alice, {"name": "lab", "kind": "jupyter"})
    until(server, alice, sleeper, {"Running"})
    until(server, alice, lab, {"Running"}, timeout=120)
    other_home = server.data_dir / "workspaces" / "alice"
    wait_for(lambda: (other_home / "jobs" / sleeper / "private.txt").exists(), what="alice's file")
    other_pid = _pid_file(server, sleeper)["child_pid"]
    lab_scratch = next((server.data_dir / "scratch").glob(f"{lab}.*"))
    targets = {
        "database": server.env["CALDERA_DATABASE_URL"].removeprefix("sqlite:///"),
        "keys": str(server.data_dir / "secrets.json"),
        "data_dir": str(server.data_dir),
        "runs": str(server.data_dir / "runs"),
        "other_log": str(next((server.data_dir / "runs" / sleeper).rglob("rank-0.log"))),
        "other_home": str(other_home),
        "other_file": str(other_home / "jobs" / sleeper / "private.txt"),
        "other_pid": other_pid,
        "credentials": str(credentials),
        "other_scratch": str(lab_scratch),
        "lab_socket": str(lab_scratch / "lab.sock"),
    }
    attack = _post(
        server, bob, {"name": "attack", "command": ["python3", "-c", ATTACK], "env": {"TARGETS": json.dumps(targets)}}
    )
    done = until(server, bob, attack, {"Succeeded", "Failed"}, timeout=90)
    log = httpx.get(f"{server.url}/api/v1/jobs/{attack}/logs", headers=bob).text
    assert done["state"] == "Succeeded", log
    seen = json.loads(log.strip().splitlines()[-1])

    attempts = {
        k: v
        for k, v in seen.items()
        if k not in ("uid", "groups", "CapEff", "CapPrm", "NoNewPrivs", "home", "platform env")
    }
    assert attempts == dict.fromkeys(attempts, "denied") and len(attempts) == 14
    assert secret not in log
    bob_os = _os_uid(server, "bob")
    assert (
        seen["uid"] == bob_os and bob_os not in (0, _os_uid(server, "alice")) and seen["groups"] == []
    )  # no supplementary group
    assert int(seen["CapEff"], 16) == 0 and int(seen["CapPrm"], 16) == 0 and seen["NoNewPrivs"] == "1"
    assert seen["home"] == str(server.data_dir / "workspaces" / "bob") and seen["platform env"] == []
    # what the job may have: its own space, 0700 and its own
    bob_home = server.data_dir / "workspaces" / "bob"
    assert (bob_home.stat().st_uid, bob_home.stat().st_mode & 0o777) == (bob_os, 0o700)
    assert not (server.data_dir / "planted").exists()
    for jid in (sleeper, lab):
        httpx.post(f"{server.url}/api/v1/jobs/{jid}/cancel", headers=alice)


def _os_uid(server, username: str) -> int:
    from sqlalchemy import create_engine, text

    engine = create_engine(server.env["CALDERA_DATABASE_URL"])
    with engine.connect() as conn:
        uid = conn.execute(text("select os_uid from users where username = :u"), {"u": username}).scalar_one()
    engine.dispose()
    return uid


@sqlite_only
def test_platform_files_are_the_platforms_alone(server):
    h = token(server)
    jid = _post(server, h, {"name": "x", "command": ["true"]})
    until(server, h, jid, {"Succeeded"})
    data = server.data_dir
    database = Path(server.env["CALDERA_DATABASE_URL"].removeprefix("sqlite:///"))
    modes = {p.name: p.stat().st_mode & 0o777 for p in (data, data / "runs", database, data / "secrets.json")}
    assert modes == {"data": 0o711, "runs": 0o700, "caldera.db": 0o600, "secrets.json": 0o600}
    for wal in database.parent.glob("caldera.db-*"):
        assert wal.stat().st_mode & 0o077 == 0, wal
    assert all(p.stat().st_uid == 0 for p in (data / "runs").rglob("*"))


def test_unprivileged_server_refuses_to_run_unisolated_unless_told(tmp_path):
    """Run as an ordinary user, `caldera up` says plainly that jobs would not be isolated, and stops."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALDERA_")}
    cmd = [
        "runuser",
        "-u",
        "nobody",
        "--",
        sys.executable,
        "-m",
        "caldera.cli.main",
        "up",
        "--data-dir",
        str(tmp_path / "data"),
        "--port",
        "1",
    ]
    os.chmod(tmp_path, 0o777)
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[1])
    assert r.returncode == 1 and "cannot isolate jobs" in r.stderr and "--unisolated" in r.stderr, r.stderr
