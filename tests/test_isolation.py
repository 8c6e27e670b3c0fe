"""A job of one user, run by a real `caldera up` as root, attacks the platform and another user's jobs, under
each runtime: the process runtime and the container runtime (skipped, saying why, where podman is not usable).

Every attack of the security review runs from inside a job and must be refused: reading the database, the keys,
another user's run directory, workspace, process environment or lab, the admin's CLI credentials and /etc/shadow;
signalling another user's process; writing into the data directory; keeping any capability or gaining one.
A process job must be denied each of them (the target is there: a missing one fails the test). In a container
the host's files are not there at all, so "not there" counts too, once the test has seen that the target exists
on the host; what the container does have of the host (the job's own workspace and scratch, and the directories
podman makes to mount them) must show nothing else.
"""

import json
import os
import pwd
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from tests import needs
from tests.conftest import ServerProcess, free_port, kill_job_processes, server_env, traversable, wait_for
from tests.needs import root_user  # noqa: F401 - fixture
from tests.runtime.test_container_jupyter import jupyter_image  # noqa: F401 - fixture: an image with JupyterLab
from tests.test_server_process import token, until

pytestmark = pytest.mark.usefixtures("root_user")
sqlite_only = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
RUNTIMES = ["local", "container"]
# what the attack reports besides its denied-or-not attempts
JUDGED_APART = ("uid", "groups", "CapEff", "CapPrm", "NoNewPrivs", "home", "platform env", "data dir listing",
                "platform port")  # fmt: skip


@pytest.fixture
def runtime_name(request) -> str:
    name = request.param
    if name == "container":
        needs.podman()
    return name


@pytest.fixture
def lab_image(runtime_name, request) -> str | None:
    """The image of the lab job: the default one for processes; in a container one with JupyterLab."""
    return request.getfixturevalue("jupyter_image") if runtime_name == "container" else None


@pytest.fixture
def server(tmp_path, db_url, runtime_name):
    env = {**server_env(tmp_path, db_url), "CALDERA_RUNTIME": runtime_name}
    srv = ServerProcess(traversable(tmp_path) / "data", free_port(), env).start()
    yield srv
    srv.stop()
    kill_job_processes(srv.data_dir)


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
        except (FileNotFoundError, ProcessLookupError):   # judged by the test: not there, or a wrong target
            out[name] = "absent"
        except OSError as exc:
            out[name] = "ERROR: " + repr(exc)

    attempt("database", lambda: open(t["database"], "rb").read(64))
    attempt("keys", lambda: open(t["keys"]).read())
    try:  # judged apart: a container has a data dir of its own, podman's mount points
        out["data dir listing"] = sorted(os.listdir(t["data_dir"]))
    except PermissionError:
        out["data dir listing"] = "denied"
    attempt("write data dir", lambda: open(os.path.join(t["data_dir"], "planted"), "w").write("x"))
    attempt("runs dir", lambda: os.listdir(t["runs"]))
    attempt("profile records", lambda: os.listdir(t["profiles"]))
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
    try:  # judged apart: a process shares the host's network, a container has only its own loopback
        socket.create_connection(("127.0.0.1", t["api_port"]), timeout=5).close()
        out["platform port"] = "connected"
    except OSError as exc:
        out["platform port"] = type(exc).__name__
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


def _host_pid(server, runtime_name, jid) -> int:
    """The host's pid of the job's command (rank 0)."""
    if runtime_name == "local":
        return json.loads(next((server.data_dir / "runs" / jid).rglob("rank-0.pid")).read_text())["child_pid"]
    name = f"caldera-{jid}-{next((server.data_dir / 'runs' / jid).iterdir()).name}-0"
    out = subprocess.run(["podman", "inspect", "--format", "{{.State.Pid}}", name], capture_output=True, text=True)
    return int(out.stdout.strip())


@sqlite_only
@pytest.mark.parametrize("runtime_name", RUNTIMES, indirect=True)
def test_a_job_cannot_reach_the_platform_or_another_user(server, tmp_path, runtime_name, lab_image):
    needs.module("jupyterlab")
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
    lab = _post(server, alice, {"name": "lab", "kind": "jupyter", **({"image": lab_image} if lab_image else {})})
    until(server, alice, sleeper, {"Running"})
    until(server, alice, lab, {"Running"}, timeout=120)
    other_home = server.data_dir / "workspaces" / "alice"
    wait_for(lambda: (other_home / "jobs" / sleeper / "private.txt").exists(), what="alice's file")
    other_pid = _host_pid(server, runtime_name, sleeper)
    lab_scratch = next((server.data_dir / "scratch").glob(f"{lab}.*"))
    targets = {
        "database": server.env["CALDERA_DATABASE_URL"].removeprefix("sqlite:///"),
        "keys": str(server.data_dir / "secrets.json"),
        "data_dir": str(server.data_dir),
        "runs": str(server.data_dir / "runs"),
        "profiles": str(server.data_dir / "profiles"),
        "other_log": str(next((server.data_dir / "runs" / sleeper).rglob("rank-0.log"))),
        "other_home": str(other_home),
        "other_file": str(other_home / "jobs" / sleeper / "private.txt"),
        "other_pid": other_pid,
        "credentials": str(credentials),
        "other_scratch": str(lab_scratch),
        "lab_socket": str(lab_scratch / "lab.sock"),
        "api_port": server.port,
    }
    attack = _post(
        server, bob, {"name": "attack", "command": ["python3", "-c", ATTACK], "env": {"TARGETS": json.dumps(targets)}}
    )
    done = until(server, bob, attack, {"Succeeded", "Failed"}, timeout=90)
    log = httpx.get(f"{server.url}/api/v1/jobs/{attack}/logs", headers=bob).text
    assert done["state"] == "Succeeded", log
    seen = json.loads(log.strip().splitlines()[-1])

    attempts = {k: v for k, v in seen.items() if k not in JUDGED_APART}
    assert len(attempts) == 14, attempts
    if runtime_name == "local":
        # another user's process is not even there (each job has a PID namespace of its own), and neither is what
        # lies below /tmp on the host (here: the whole data directory; each job has a /tmp of its own): the rest
        # is refused. Writing into the data directory meets the root-made path to the job's own directories
        assert os.path.exists(f"/proc/{other_pid}/environ")
        hidden = {k for k, t in ATTEMPT_TARGET.items() if t == "other_pid" or (t and _below_tmp(targets[t]))}
        hidden.discard("write data dir")
        assert attempts == {k: "absent" if k in hidden else "denied" for k in attempts}, attempts
        assert seen["data dir listing"] == "denied"
    else:
        for path in (v for k, v in targets.items() if k not in ("other_pid", "data_dir", "api_port")):
            assert os.path.exists(path), path  # so that "absent" in the container means hidden, not mistaken
        assert os.path.exists(f"/proc/{other_pid}/environ")
        assert set(attempts.values()) <= {"denied", "absent"}, attempts
        # the container's own data dir holds only the mount points of bob's workspace and scratch
        assert seen["data dir listing"] in ("denied", ["scratch", "workspaces"], ["workspaces"]), seen
    # a batch job in a container has no network but its own loopback: not even the platform's port on the host
    assert seen["platform port"] == ("connected" if runtime_name == "local" else "ConnectionRefusedError"), seen
    assert secret not in log
    bob_os = _os_uid(server, "bob")
    assert seen["uid"] == bob_os and bob_os not in (0, _os_uid(server, "alice"))
    # no supplementary group; podman adds the primary one as one (its fix of CVE-2022-2989), which gives nothing more
    own_group = [] if runtime_name == "local" else [pwd.getpwuid(bob_os).pw_gid]
    assert seen["groups"] == own_group, seen["groups"]
    assert int(seen["CapEff"], 16) == 0 and int(seen["CapPrm"], 16) == 0 and seen["NoNewPrivs"] == "1"
    assert seen["home"] == str(server.data_dir / "workspaces" / "bob") and seen["platform env"] == []
    # what the job may have: its own space, 0700 and its own
    bob_home = server.data_dir / "workspaces" / "bob"
    assert (bob_home.stat().st_uid, bob_home.stat().st_mode & 0o777) == (bob_os, 0o700)
    assert not (server.data_dir / "planted").exists()
    for jid in (sleeper, lab):
        httpx.post(f"{server.url}/api/v1/jobs/{jid}/cancel", headers=alice)


# which of the targets each attempt of ATTACK tries (None: not the platform's)
ATTEMPT_TARGET = {
    "database": "database",
    "keys": "keys",
    "write data dir": "data_dir",
    "runs dir": "runs",
    "profile records": "profiles",
    "other's log": "other_log",
    "other's workspace": "other_home",
    "other's file": "other_file",
    "other's environ": "other_pid",
    "signal other": "other_pid",
    "admin's CLI credentials": "credentials",
    "shadow": None,
    "other's lab scratch": "other_scratch",
    "other's lab socket": "lab_socket",
}


def _below_tmp(path: str) -> bool:
    return any(os.path.commonpath([os.path.realpath(path), top]) == top for top in ("/tmp", "/var/tmp"))


def _os_uid(server, username: str) -> int:
    from sqlalchemy import create_engine, text

    engine = create_engine(server.env["CALDERA_DATABASE_URL"])
    with engine.connect() as conn:
        uid = conn.execute(text("select os_uid from users where username = :u"), {"u": username}).scalar_one()
    engine.dispose()
    return uid


@sqlite_only
@pytest.mark.parametrize("runtime_name", RUNTIMES, indirect=True)
def test_platform_files_are_the_platforms_alone(server):
    h = token(server)
    jid = _post(server, h, {"name": "x", "command": ["true"]})
    until(server, h, jid, {"Succeeded"})
    data = server.data_dir
    database = Path(server.env["CALDERA_DATABASE_URL"].removeprefix("sqlite:///"))
    files = (data, data / "runs", data / "profiles", database, data / "secrets.json")
    modes = {p.name: p.stat().st_mode & 0o777 for p in files}
    assert modes == {"data": 0o711, "runs": 0o700, "profiles": 0o700, "caldera.db": 0o600, "secrets.json": 0o600}
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
