"""``Runtime.exec`` of the process runtime, as the attacker sees it: the command runs inside the rank (its PID,
mount and network namespaces) as the job's uid with no capability, never as root, its argv never read as options
by a root helper, and it ends with the job."""

from __future__ import annotations

import json
import os
import select
import time

import pytest

from caldera.runtime.base import ExecError, Phase
from caldera.runtime.exec_process import STDERR, STDOUT, ExecProcess
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


@pytest.mark.parametrize(
    "argv", [["--version"], ["--target=1", "--mount", "sh"], ["-h"], ["--", "id"], ["-c", "id"]]
)
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
