"""The process runtime seen from both sides, as an attacker would try it: what a user puts in a job spec (its
environment) never runs in a root process, a symlink a job planted never makes root read, write or mount through
it, and each rank has its own view of the host (its own processes only, its own /tmp and /dev/shm).

Jobs run as real unprivileged uids here (the root server's way), so these tests need root."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from caldera.config import Settings
from caldera.core.cluster import Allocation
from caldera.core.spec import JobSpec
from caldera.runtime.base import Handle, LaunchError, LaunchRequest, Phase, RunAs
from caldera.runtime.local import jupyter, launchfile, owner
from caldera.runtime.local.runtime import LocalRuntime
from tests.conftest import traversable

from .conftest import wait_for, wait_terminal

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="jobs run as other uids only under a root server")

ALICE = RunAs("alice", 201_011, 201_011)
BOB = RunAs("bob", 201_012, 201_012)
# values a shell, a loader or an env file would mangle: they must reach the job exactly
TRICKY = {
    "MULTI_LINE": "first\nsecond\n",
    "QUOTES": 'it\'s "quoted" $HOME `id` \\n',
    "EQUALS": "a=b==c=",
    "SPACES": "  leading and trailing  ",
}
REPORT_ENV = textwrap.dedent("""
    import json, os, sys, time
    print(json.dumps({k: os.environ.get(k) for k in sys.argv[1].split(",")}), flush=True)
    while not os.path.exists("go"):
        time.sleep(0.05)
""")


@pytest.fixture
def rt(tmp_path: Path) -> LocalRuntime:
    return LocalRuntime(
        Settings(data_dir=traversable(tmp_path) / "data", node_name="testnode", cancel_grace_s=2.0, fake_gpus=[])
    )


@pytest.fixture
def start(rt: LocalRuntime) -> Iterator[Callable[..., Handle]]:
    """``start(run_as, **spec)``: a job of ``run_as`` in its own workspace, stopped at teardown."""
    handles: list[Handle] = []

    def _start(run_as: RunAs, **spec) -> Handle:
        job_id = f"iso-{uuid.uuid4().hex[:8]}"
        spec.setdefault("name", job_id)
        js = JobSpec.model_validate(spec)
        home = rt.settings.data_dir / "workspaces" / run_as.name
        replicas = js.replicas if js.kind.value == "distributed" else 1
        req = LaunchRequest(
            job_id=job_id,
            attempt=1,
            spec=js,
            allocations=tuple(Allocation("testnode", (), 1.0, 256) for _ in range(replicas)),
            workdir=home / "jobs" / job_id,
            run_as=run_as,
            home=home,
        )
        h = rt.launch(req)
        handles.append(h)
        return h

    yield _start
    for h in handles:
        if rt.observe(h).phase not in (Phase.SUCCEEDED, Phase.FAILED, Phase.LOST):
            rt.stop(h, 0)
            wait_terminal(rt, h, timeout=20)


def _home(rt: LocalRuntime, run_as: RunAs) -> Path:
    home = rt.settings.data_dir / "workspaces" / run_as.name
    owner.platform_dir(home.parent, 0o711)
    return owner.owned_dir(home, run_as)


def _log(rt: LocalRuntime, h: Handle, rank: int = 0) -> str:
    return b"".join(rt.logs(h, rank=rank)).decode()


def _pid_record(h: Handle, rank: int = 0) -> dict:
    return json.loads((Path(h.data["run_dir"]) / f"rank-{rank}.pid").read_text())


# -- finding 1: the job's environment never reaches a root process ---------------------------------------------


@pytest.mark.parametrize("kind", ["batch", "distributed"])
def test_loader_and_interpreter_variables_run_nothing_as_root(rt, start, kind) -> None:
    """A job sets PYTHONPATH to a directory with a sitecustomize.py and LD_PRELOAD to a library it compiled: both
    run in the job's own processes, as its uid, and in no root process of the platform (supervisor, nsenter, the
    rank's init); the values (and ones with newlines, quotes and '=') reach the job intact."""
    home = _home(rt, ALICE)
    markers = home / "markers"
    markers.mkdir(mode=0o777)
    markers.chmod(0o1777)  # root, had it run the user's code, could write here as well as the job
    mark = markers / "ran"
    pydir = home / "pylib"
    pydir.mkdir()
    (pydir / "sitecustomize.py").write_text(
        f"import os\nwith open({str(mark)!r}, 'a') as f:\n    f.write(f'python {{os.getuid()}} {{os.geteuid()}}\\n')\n"
    )
    src = home / "preload.c"
    src.write_text(
        "#include <stdio.h>\n#include <unistd.h>\n"
        "__attribute__((constructor)) static void mark(void) {\n"
        f'  FILE *f = fopen("{mark}", "a");\n'
        '  if (f) { fprintf(f, "preload %d %d\\n", getuid(), geteuid()); fclose(f); }\n}\n'
    )
    lib = home / "libmark.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src)], check=True, capture_output=True)
    env = {"PYTHONPATH": str(pydir), "LD_PRELOAD": str(lib)}
    env.update(TRICKY)
    names = ",".join(env)
    extra = {"replicas": 2} if kind == "distributed" else {}
    h = start(ALICE, kind=kind, command=[sys.executable, "-c", REPORT_ENV, names], env=env, **extra)
    ranks = h.data["world_size"]
    wait_for(lambda: all(_log(rt, h, r).strip() for r in range(ranks)), timeout=60, what="the job's report")

    for r in range(ranks):
        assert json.loads(_log(rt, h, r).splitlines()[0]) == env  # every value exactly as the user wrote it
        shim = h.data["ranks"][r]["pid"]
        rec = _pid_record(h, r)
        for root_pid in (shim, rec["init_pid"]):
            environ = Path(f"/proc/{root_pid}/environ").read_bytes()
            names_seen = {item.split(b"=", 1)[0].decode() for item in environ.split(b"\0") if item}
            assert names_seen == set(launchfile.root_env("x")), (root_pid, names_seen)
            cmdline = Path(f"/proc/{root_pid}/cmdline").read_bytes()
            assert b"-I" in cmdline.split(b"\0") and b"PYTHONPATH" not in cmdline and str(lib).encode() not in cmdline
        assert not (Path(h.data["run_dir"]) / f"rank-{r}.launch.json").exists()  # read and removed by the shim

    (home / "jobs" / h.job_id / "go").touch()  # the ranks share the working directory
    assert wait_terminal(rt, h, timeout=60).phase is Phase.SUCCEEDED
    ran = mark.read_text().split("\n")
    lines = {line for line in ran if line}
    # the job's own python and every program it exec'd ran the user's code, as the user; nothing else did
    assert f"python {ALICE.uid} {ALICE.uid}" in lines and f"preload {ALICE.uid} {ALICE.uid}" in lines
    assert lines <= {f"python {ALICE.uid} {ALICE.uid}", f"preload {ALICE.uid} {ALICE.uid}"}, lines


def test_a_command_is_looked_up_by_the_job_not_by_root(rt, start) -> None:
    """Root no longer looks at paths the user names: a command that does not exist for the job is reported as
    such, and one the job cannot reach (in another user's workspace) does not start, as root would have it."""
    _home(rt, ALICE)
    bob_home = _home(rt, BOB)
    tool = bob_home / "tool.sh"
    ran = bob_home / "ran"
    tool.write_text(f"#!/bin/sh\ntouch {ran}\n")
    tool.chmod(0o755)
    with pytest.raises(LaunchError) as missing:
        start(ALICE, command=["no-such-tool-anywhere"])
    assert (missing.value.reason, str(missing.value)) == ("CommandNotFound", "command not found: no-such-tool-anywhere")
    with pytest.raises(LaunchError) as denied:  # hidden (below /tmp, outside her view) or not traversable
        start(ALICE, command=[str(tool)])
    assert denied.value.reason == "CommandNotFound" or "Permission denied" in str(denied.value), denied.value
    assert not ran.exists()


# -- symlinks a job planted ---------------------------------------------------------------------------------


def test_a_symlink_for_the_private_tmp_mounts_nothing(rt, start, monkeypatch) -> None:
    """The job's /tmp is its scratch's ``tmp``. Replaced by a symlink (another job of the same uid can, in the
    moment before the rank starts) to a directory only root may read, the rank refuses to start: root neither
    follows nor mounts it, so the job never sees that directory."""
    _home(rt, ALICE)
    secret_dir = rt.settings.data_dir / "root-only"
    secret_dir.mkdir(parents=True, mode=0o700)
    (secret_dir / "secret").write_text("root's\n")
    real_spawn = LocalRuntime._spawn

    def plant(rd, rank, prefix, launch):
        tmp = Path(launch.private_tmp)
        tmp.rmdir()
        tmp.symlink_to(secret_dir)
        os.lchown(tmp, ALICE.uid, ALICE.gid)
        return real_spawn(rd, rank, prefix, launch)

    monkeypatch.setattr(LocalRuntime, "_spawn", staticmethod(plant))
    with pytest.raises(LaunchError) as failed:
        start(ALICE, command=["sh", "-c", "cat /tmp/secret"])
    assert failed.value.reason == "SpawnFailed" and "Not a directory: 'tmp'" in str(failed.value)


def test_a_symlinked_workdir_gives_the_job_nothing_it_did_not_have(rt, start) -> None:
    """``workdir`` below a symlink the job planted in its workspace, pointing at a root-only directory: the
    directory is made and entered by the job's uid, so the job fails to start and root created nothing there."""
    home = _home(rt, ALICE)
    target = rt.settings.data_dir / "root-only"
    target.mkdir(parents=True, mode=0o700)
    link = home / "jobs"
    link.symlink_to(target)
    os.lchown(link, ALICE.uid, ALICE.gid)
    with pytest.raises(LaunchError) as failed:
        start(ALICE, command=["true"])
    # as her uid the link leads nowhere she may go (or, below /tmp, to nothing in her view)
    assert failed.value.reason == "SpawnFailed", failed.value
    assert "Permission denied" in str(failed.value) or "No such file" in str(failed.value), failed.value
    assert list(target.iterdir()) == []


def test_authorized_keys_replace_a_planted_symlink_instead_of_following_it(tmp_path) -> None:
    scratch = owner.owned_dir(traversable(tmp_path) / "scratch", ALICE)
    victim = tmp_path / "root-file"
    victim.write_text("root's own\n")
    for name in ("authorized_keys", f".authorized_keys.{os.getpid()}.tmp"):
        (scratch / name).symlink_to(victim)
    env = owner.authorized_keys(scratch, "ssh-ed25519 AAAA alice@laptop\n", ALICE)
    keys = scratch / "authorized_keys"
    assert env == {"CALDERA_SSH_AUTHORIZED_KEYS": str(keys)}
    assert victim.read_text() == "root's own\n"
    assert not keys.is_symlink() and keys.read_text() == "ssh-ed25519 AAAA alice@laptop\n"
    assert (keys.stat().st_uid, keys.stat().st_mode & 0o777) == (ALICE.uid, 0o600)


def test_the_platform_never_connects_through_a_symlinked_lab_socket(tmp_path) -> None:
    """A job replaces its lab's socket with a symlink to another socket of the host (another lab, a root
    service): the platform's login does not connect there. The control: the same server at the real path."""
    scratch = owner.owned_dir(traversable(tmp_path) / "scratch", ALICE)
    other = tmp_path / "other.sock"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(other))
    server.listen()
    server.settimeout(5)
    accepted: list[bytes] = []

    def serve() -> None:
        try:
            while True:
                conn, _ = server.accept()
                accepted.append(conn.recv(4096))
                conn.sendall(b"HTTP/1.1 200 OK\r\nSet-Cookie: username-localhost=x\r\nContent-Length: 0\r\n\r\n")
                conn.close()
        except OSError:
            pass

    threading.Thread(target=serve, daemon=True).start()
    link = scratch / "lab.sock"
    link.symlink_to(other)
    assert jupyter.login(str(link), "/", "job-token", timeout_s=2) is None
    assert jupyter.pin_socket(str(link), tmp_path / "pinned.sock") is None  # nor is it linked for the proxy
    assert accepted == [] and not (tmp_path / "pinned.sock").exists()
    assert jupyter.login(str(other), "/", "job-token", timeout_s=2) == "username-localhost=x"  # the control
    assert len(accepted) == 1 and b"job-token" in accepted[0]
    server.close()


def test_a_socket_swapped_for_a_symlink_after_the_login_does_not_redirect_the_proxy(tmp_path) -> None:
    """Both runtimes hand their proxy (root) ``jupyter.pinned_socket``: once the session's socket is pinned, a
    symlink the job puts at its path later (to podman's socket, another lab's) changes nothing."""
    scratch = owner.owned_dir(traversable(tmp_path) / "scratch", ALICE)
    lab, other = socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX)
    lab.bind(str(scratch / "lab.sock"))
    other.bind(str(tmp_path / "other.sock"))
    pinned = tmp_path / "run" / "lab.sock"
    pinned.parent.mkdir()
    assert jupyter.pinned_socket(str(scratch / "lab.sock"), pinned) == str(pinned)
    lab_inode = os.stat(scratch / "lab.sock").st_ino
    (scratch / "lab.sock").unlink()
    (scratch / "lab.sock").symlink_to(tmp_path / "other.sock")
    assert jupyter.pinned_socket(str(scratch / "lab.sock"), pinned) == str(pinned)
    assert os.stat(pinned).st_ino == lab_inode != os.stat(tmp_path / "other.sock").st_ino
    lab.close()
    other.close()


def test_removing_lab_secrets_does_not_follow_a_planted_symlink(tmp_path) -> None:
    scratch = owner.owned_dir(traversable(tmp_path) / "scratch", ALICE)
    elsewhere = tmp_path / "another-lab-runtime"
    elsewhere.mkdir()
    (elsewhere / "jupyter_cookie_secret").write_text("another lab's\n")
    (scratch / "runtime").symlink_to(elsewhere)
    owner.remove_owned(scratch, Path("runtime", "jupyter_cookie_secret"))
    assert (elsewhere / "jupyter_cookie_secret").read_text() == "another lab's\n"
    real = owner.owned_dir(scratch / "lab", ALICE)
    (real / "jupyter_cookie_secret").write_text("own\n")
    owner.remove_owned(scratch, Path("lab", "jupyter_cookie_secret"))  # the control
    assert not (real / "jupyter_cookie_secret").exists()


# -- finding 8: each rank its own view of the host ----------------------------------------------------------

SLEEP = "import time; time.sleep(300)"
PEEK = textwrap.dedent("""
    import json, os, sys
    target_pid, marker = int(sys.argv[1]), os.environ["MARKER"]  # not in its own command line
    out = {"pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()), "seen_marker": False}
    for p in out["pids"]:
        try:
            if marker.encode() in open(f"/proc/{p}/cmdline", "rb").read():
                out["seen_marker"] = True
        except OSError:
            pass
    try:
        os.kill(target_pid, 0)
        out["signal"] = "sent"
    except ProcessLookupError:
        out["signal"] = "no such process"
    except PermissionError:
        out["signal"] = "denied"
    out["tmp"] = sorted(os.listdir("/tmp"))
    out["shm"] = sorted(os.listdir("/dev/shm"))
    for d in ("/tmp", "/dev/shm"):
        open(os.path.join(d, "bob-was-here"), "w").close()
    print(json.dumps(out))
""")


def test_a_job_sees_only_its_own_processes_tmp_and_shm(rt, start) -> None:
    _home(rt, ALICE)
    _home(rt, BOB)
    marker = m = f"alice-private-{uuid.uuid4().hex}"
    alice = start(
        ALICE,
        command=["sh", "-c", f"echo a > /tmp/{m}; echo a > /dev/shm/{m}; exec {sys.executable} -c '{SLEEP}' {m}"],
    )
    alice_workdir = rt.settings.data_dir / "workspaces" / "alice" / "jobs" / alice.job_id
    wait_for(lambda: _pid_record(alice).get("child_pid"), what="alice's command")
    alice_pid = _pid_record(alice)["child_pid"]
    wait_for(lambda: marker.encode() in Path(f"/proc/{alice_pid}/cmdline").read_bytes(), what="alice's exec")
    alice_scratch = Path(alice.data["scratch"])
    wait_for(lambda: (alice_scratch / "tmp" / marker).exists(), what="alice's /tmp file")  # her /tmp is hers

    bob = start(BOB, command=[sys.executable, "-c", PEEK, str(alice_pid)], env={"MARKER": marker})
    assert wait_terminal(rt, bob, timeout=60).phase is Phase.SUCCEEDED, _log(rt, bob)
    seen = json.loads(_log(rt, bob).strip().splitlines()[-1])
    assert seen["pids"] and max(seen["pids"]) < 10, seen["pids"]  # its init, its command: nobody else's
    assert seen["seen_marker"] is False and seen["signal"] == "no such process"
    assert marker not in seen["tmp"] and seen["shm"] == []
    assert not (Path("/tmp") / "bob-was-here").exists() and not Path("/dev/shm/bob-was-here").exists()
    assert (Path(bob.data["scratch"]) / "tmp" / "bob-was-here").exists()  # bob's /tmp is his scratch's tmp
    assert not (Path("/tmp") / marker).exists() and not alice_workdir.joinpath(marker).exists()
    # alice's command is still there, untouched, seen from the host
    assert rt.observe(alice).phase is Phase.RUNNING
