"""``Runtime.exec`` of the process runtime, as the attacker sees it: the command runs inside the rank (its PID,
mount and network namespaces) as the job's uid with no capability, never as root, its argv never read as options
by a root helper, and it ends with the job."""

from __future__ import annotations

import json
import os
import select
import time
import uuid

import pytest

from caldera.config import Settings
from caldera.core.spec import JobSpec
from caldera.runtime.base import ExecError, LaunchRequest, Phase
from caldera.runtime.container.runtime import ContainerRuntime
from caldera.runtime.exec_process import STDERR, STDOUT, ExecProcess
from tests import needs
from tests.conftest import traversable
from tests.runtime.conftest import wait_for, wait_terminal
from tests.runtime.test_process_isolation import ALICE, rt, start  # noqa: F401 - fixtures

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="jobs run as other uids only under a root server")

REPORT = (
    "import json, os; s = dict(l.split(':', 1) for l in open('/proc/self/status') if ':' in l); "
    "print(json.dumps({'uid': os.getuid(), 'gid': os.getgid(), 'groups': os.getgroups(), "
    "'cap': s['CapEff'].strip(), 'nnp': s['NoNewPrivs'].strip(), 'cwd': os.getcwd(), 'env': dict(os.environ), "
    "'pids': sorted(int(p) for p in os.listdir('/proc') if p.isdigit()), 'tmp': sorted(os.listdir('/tmp'))}))"
)


def collect(proc: ExecProcess, data: bytes = b"", timeout: float = 30) -> tuple[dict[int, bytes], int]:
    """Everything the command writes, per stream, and its exit code."""
    if data:
        proc.write(data)
    if data or not proc.tty:
        proc.close_input()
    got = {STDOUT: b"", STDERR: b""}
    open_fds = dict((fd, stream) for stream, fd in proc.outputs())
    deadline = time.monotonic() + timeout
    while open_fds and time.monotonic() < deadline:
        ready, _, _ = select.select(list(open_fds), [], [], 0.5)
        for fd in ready:
            chunk = proc.read(fd)
            if chunk:
                got[open_fds[fd]] += chunk
            else:
                del open_fds[fd]
    code = proc.wait(timeout=10)
    proc.close()
    return got, code


def test_a_command_runs_in_the_rank_as_the_job_uid(rt, start) -> None:  # noqa: F811
    h = start(ALICE, command=["sh", "-c", "echo job-marker > /tmp/in-job-tmp; exec sleep 300"])
    wait_for(lambda: rt.observe(h).phase is Phase.RUNNING, what="running")
    wait_for(lambda: os.path.exists(f"{h.data['scratch']}/tmp/in-job-tmp"), what="the job's /tmp file")
    out, code = collect(rt.exec(h, 0, ["python3", "-c", REPORT], tty=False))
    assert code == 0, out
    seen = json.loads(out[STDOUT])
    assert (seen["uid"], seen["gid"], seen["groups"]) == (ALICE.uid, ALICE.gid, [])
    assert int(seen["cap"], 16) == 0 and seen["nnp"] == "1"
    # the rank's own PID namespace (its init is 1, the test's process is not there) and its own /tmp
    assert 1 in seen["pids"] and os.getpid() not in seen["pids"] and len(seen["pids"]) < 10, seen["pids"]
    assert "in-job-tmp" in seen["tmp"]
    assert seen["cwd"] == h.data["workdir"]
    assert seen["env"]["HOME"] == str(rt.settings.data_dir / "workspaces" / "alice")
    assert seen["env"]["USER"] == "alice" and seen["env"]["CALDERA_JOB_ID"] == h.job_id
    assert not [k for k in seen["env"] if k.startswith("CALDERA_") and k not in ("CALDERA_JOB_ID", "CALDERA_ATTEMPT",
                                                                                "CALDERA_RUN_TAG")]  # fmt: skip


def test_exit_code_stderr_and_stdin(rt, start) -> None:  # noqa: F811
    h = start(ALICE, command=["sleep", "300"])
    wait_for(lambda: rt.observe(h).phase is Phase.RUNNING, what="running")
    out, code = collect(rt.exec(h, 0, ["sh", "-c", "cat; echo oops >&2; exit 7"], tty=False), b"from stdin\n")
    assert (out[STDOUT], out[STDERR], code) == (b"from stdin\n", b"oops\n", 7)


@pytest.mark.parametrize("argv", [["--version"], ["--target=1", "--mount", "sh"], ["-h"], ["--", "id"], ["-c", "id"]])
def test_the_users_argv_is_never_an_option_of_a_root_helper(rt, start, argv) -> None:  # noqa: F811
    """nsenter, setsid and Python see the user's words only as the command to exec, looked up by the job."""
    h = start(ALICE, command=["sleep", "300"])
    wait_for(lambda: rt.observe(h).phase is Phase.RUNNING, what="running")
    out, code = collect(rt.exec(h, 0, argv, tty=False))
    assert code == 127, out
    assert out[STDOUT] == b"" and b"No such file" in out[STDERR], out


def test_a_terminal_runs_a_shell_that_resizes_and_ends_with_the_job(rt, start) -> None:  # noqa: F811
    h = start(ALICE, command=["sleep", "300"])
    wait_for(lambda: rt.observe(h).phase is Phase.RUNNING, what="running")
    proc = rt.exec(h, 0, ["sh"], tty=True, term="xterm")
    proc.resize(33, 111)
    proc.write(b"echo term=$TERM; stty size; id -u\n")
    seen = b""

    def shows() -> bool:
        nonlocal seen
        if select.select([proc.master], [], [], 0.2)[0]:
            seen += proc.read(proc.master)
        return b"33 111" in seen and str(ALICE.uid).encode() in seen

    wait_for(shows, 20, what="the shell's answer")
    assert b"term=xterm" in seen
    rt.stop(h, 0)
    wait_terminal(rt, h, timeout=20)
    # the rank's PID namespace is gone, and the shell with it
    assert proc.wait(timeout=20) != 0


def test_a_rank_that_is_not_running_is_refused(rt, start) -> None:  # noqa: F811
    h = start(ALICE, command=["true"])
    wait_terminal(rt, h)
    with pytest.raises(ExecError) as err:
        rt.exec(h, 0, ["id"], tty=False)
    assert err.value.reason == "NotRunning"
    h2 = start(ALICE, command=["sleep", "300"])
    wait_for(lambda: rt.observe(h2).phase is Phase.RUNNING, what="running")
    with pytest.raises(ExecError) as err:
        rt.exec(h2, 1, ["id"], tty=False)
    assert err.value.reason == "NoSuchRank"


# -- the container runtime: podman exec as the job's uid ----------------------------------------------------------


@pytest.fixture
def container(tmp_path):
    needs.podman()
    return ContainerRuntime(Settings(data_dir=traversable(tmp_path) / "data", node_name="ctr", cancel_grace_s=2.0))


@pytest.fixture
def in_container(container):
    home = container.settings.workspaces / "alice"
    job_id = f"ex-{uuid.uuid4().hex[:10]}"
    req = LaunchRequest(
        job_id, 1, JobSpec.model_validate({"name": job_id, "command": ["sleep", "300"]}), (),
        workdir=home / "jobs" / job_id, run_as=ALICE, home=home,
    )  # fmt: skip
    h = container.launch(req)
    wait_for(lambda: container.observe(h).phase is Phase.RUNNING, 60, what="the container")
    yield h
    container.stop(h, 0)
    wait_terminal(container, h, timeout=60)


def test_container_exec_runs_as_the_job_uid_without_capabilities(container, in_container) -> None:
    script = "id -u; id -G; grep -E '^(CapEff|NoNewPrivs)' /proc/self/status; cat; echo err >&2; exit 3"
    out, code = collect(container.exec(in_container, 0, ["sh", "-c", script], tty=False), b"piped\n", timeout=60)
    assert code == 3, out
    lines = out[STDOUT].decode().splitlines()
    assert lines[0] == str(ALICE.uid) and lines[1] == str(ALICE.gid), lines
    assert "CapEff:\t0000000000000000" in lines and "NoNewPrivs:\t1" in lines and lines[-1] == "piped"
    assert out[STDERR] == b"err\n"


@pytest.mark.parametrize("argv", [["--privileged", "sh"], ["--user=0", "id"], ["-h"]])
def test_container_exec_argv_is_never_an_option_of_podman(container, in_container, argv) -> None:
    out, code = collect(container.exec(in_container, 0, argv, tty=False), timeout=60)
    assert code in (126, 127), out
    assert out[STDOUT] == b"", out


def test_container_exec_terminal_resizes(container, in_container) -> None:
    proc = container.exec(in_container, 0, ["sh"], tty=True, term="xterm-256color")
    seen = b""

    def shows(what: bytes) -> bool:
        nonlocal seen
        if select.select([proc.master], [], [], 0.2)[0]:
            seen += proc.read(proc.master)
        return what in seen

    proc.write(b"echo ready\n")
    wait_for(lambda: shows(b"ready\r\n"), 30, what="the shell")
    proc.resize(41, 123)
    time.sleep(0.5)  # podman passes the new size on when SIGWINCH reaches it
    proc.write(b"stty size; echo $TERM; id -u\n")
    wait_for(lambda: shows(b"41 123"), 30, what="the new size")
    assert b"xterm-256color" in seen and str(ALICE.uid).encode() in seen
    proc.write(b"exit 5\n")
    assert proc.wait(timeout=30) == 5
    proc.close()
