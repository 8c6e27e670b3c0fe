"""Batch jobs: environment, exit codes, logs, all-or-nothing launch."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest

from caldera.runtime.base import Handle, LaunchError, Phase
from caldera.runtime.local import procs
from caldera.runtime.local.rundir import RunDir, write_json_atomic
from caldera.runtime.local.runtime import LocalRuntime

from .conftest import wait_for, wait_terminal

PRINT_ENV = (
    "import json, os; keys = ['CUDA_VISIBLE_DEVICES', 'CUDA_DEVICE_ORDER', 'CALDERA_JOB_ID', "
    "'CALDERA_ATTEMPT', 'CALDERA_PREEMPT_NOTICE', 'CALDERA_ACCOUNT', 'USER_VAR', 'CALDERA_SECRET_KEY']; "
    "env = {k: os.environ.get(k) for k in keys}; "
    "env['notice_exists'] = os.path.exists(env['CALDERA_PREEMPT_NOTICE']); "
    "print(json.dumps({'cwd': os.getcwd(), **env}))"
)


def _log(rt: LocalRuntime, h: Handle, rank: int | None = None) -> bytes:
    return b"".join(rt.logs(h, rank=rank))


def test_batch_success_sees_its_environment(launch, runtime, settings, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("CALDERA_SECRET_KEY", "server-only")  # the server's settings must not leak into jobs
    h = launch(
        job_id="b1",
        attempt=2,
        gpus=((1, 0),),
        req_env={"CALDERA_ACCOUNT": "physics"},
        command=[sys.executable, "-c", PRINT_ENV],
        env={"USER_VAR": "hello", "CALDERA_JOB_ID": "spoof"},
    )
    obs = wait_terminal(runtime, h)
    assert (obs.phase, obs.exit_code) == (Phase.SUCCEEDED, 0)
    seen = json.loads(_log(runtime, h))
    run_dir = settings.runs_dir / "b1" / "2"
    assert seen == {
        "cwd": str(tmp_path / "work" / "b1"),  # created by launch
        "CUDA_VISIBLE_DEVICES": "1,0",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CALDERA_JOB_ID": "b1",
        "CALDERA_ATTEMPT": "2",
        "CALDERA_PREEMPT_NOTICE": str(settings.scratch_dir / "b1.2" / "preempt-notice"),
        "notice_exists": False,
        "CALDERA_ACCOUNT": "physics",
        "USER_VAR": "hello",
        "CALDERA_SECRET_KEY": None,
    }
    assert h.data["run_dir"] == str(run_dir) and h.data["kind"] == "batch"
    json.dumps(h.data)  # persisted by the server as JSON
    for name in ("meta.json", "rank-0.log", "rank-0.pid", "rank-0.exit"):
        assert (run_dir / name).is_file(), name


def test_no_gpus_means_empty_cuda_visible_devices(launch, runtime) -> None:
    h = launch(gpus=(), command=["sh", "-c", 'echo "[${CUDA_VISIBLE_DEVICES-unset}]"'])
    assert wait_terminal(runtime, h).phase is Phase.SUCCEEDED
    assert _log(runtime, h) == b"[]\n"


def test_failure_reports_the_exit_code_and_logs_stderr(launch, runtime) -> None:
    h = launch(command=["sh", "-c", "echo out; echo err >&2; exit 3"])
    obs = wait_terminal(runtime, h)
    assert (obs.phase, obs.exit_code, obs.reason) == (Phase.FAILED, 3, "ExitCode")
    assert _log(runtime, h) == b"out\nerr\n"


def test_death_by_signal_is_exit_code_128_plus_signal(launch, runtime) -> None:
    h = launch(command=["sh", "-c", "kill -SEGV $$"])
    obs = wait_terminal(runtime, h)
    assert (obs.phase, obs.exit_code) == (Phase.FAILED, 139)
    assert "SIGSEGV" in obs.message


def test_unknown_command_fails_the_launch(launch, settings) -> None:
    with pytest.raises(LaunchError, match="command not found: no-such-tool") as failed:
        launch(job_id="nf", command=["no-such-tool", "--help"])
    assert failed.value.reason == "CommandNotFound"
    assert not (settings.runs_dir / "nf" / "1").exists()


def test_command_relative_to_workdir(launch, runtime, tmp_path) -> None:
    script = tmp_path / "work" / "rel" / "run.sh"
    script.parent.mkdir(parents=True)
    script.write_text("#!/bin/sh\necho relative ok\n")
    script.chmod(0o755)
    h = launch(job_id="rel", command=["./run.sh"])
    assert wait_terminal(runtime, h).phase is Phase.SUCCEEDED
    assert _log(runtime, h) == b"relative ok\n"


def test_all_or_nothing_when_a_rank_cannot_spawn(launch, runtime, settings, monkeypatch) -> None:
    real_spawn = runtime._spawn
    spawned = []

    def spawn(rd, rank, *args, **kwargs):
        if rank == 2:
            raise OSError("fork failed: resource temporarily unavailable")
        p = real_spawn(rd, rank, *args, **kwargs)
        spawned.append((p.pid, procs.start_time(p.pid)))
        return p

    monkeypatch.setattr(runtime, "_spawn", spawn)
    with pytest.raises(LaunchError, match="fork failed") as failed:
        launch(job_id="gang", kind="distributed", replicas=3, command=["sleep", "60"])
    assert failed.value.reason == "StartFailed"
    assert len(spawned) == 2
    assert not any(procs.is_alive(pid, st) for pid, st in spawned)  # the started ranks were killed
    wait_for(lambda: not procs.job_processes(set(), tag_prefix="gang/1/"), timeout=10)
    assert not (settings.runs_dir / "gang" / "1").exists()  # a retry of attempt 1 starts clean


def test_logs_follow_until_the_job_ends(launch, runtime) -> None:
    h = launch(command=["sh", "-c", "for i in 1 2 3 4 5; do echo line $i; sleep 0.2; done; echo done >&2"])
    got = b"".join(runtime.logs(h, follow=True))
    assert got == b"".join(b"line %d\n" % i for i in range(1, 6)) + b"done\n"
    assert runtime.observe(h).phase is Phase.SUCCEEDED
    assert b"".join(runtime.logs(h, offset=7)) == got[7:]


def test_logs_and_observe_from_a_new_runtime_with_an_empty_handle(launch, runtime, settings) -> None:
    h = launch(job_id="later", command=["sh", "-c", "echo persisted; exit 4"])
    wait_terminal(runtime, h)
    fresh = LocalRuntime(settings)
    bare = Handle("later", 1)  # e.g. the server lost handle.data: meta.json in the run dir has it
    assert b"".join(fresh.logs(bare, follow=True)) == b"persisted\n"
    obs = fresh.observe(bare)
    assert (obs.phase, obs.exit_code) == (Phase.FAILED, 4)
    with pytest.raises(ValueError):
        fresh.logs(bare, rank=1)
    assert fresh.observe(Handle("never-launched", 1)).phase is Phase.LOST


def test_relaunching_a_running_attempt_is_refused(launch, runtime) -> None:
    launch(job_id="dup", command=["sleep", "30"])
    with pytest.raises(LaunchError, match="already running") as failed:
        launch(job_id="dup", command=["sleep", "30"])
    assert failed.value.reason == "AlreadyRunning"


def test_run_dir_files_are_atomic_json(launch, runtime, settings) -> None:
    h = launch(job_id="files", command=["true"])
    wait_terminal(runtime, h)
    run_dir = Path(h.data["run_dir"])
    rec = json.loads((run_dir / "rank-0.exit").read_text())
    assert rec["exit_code"] == 0 and rec["signal"] is None
    pid = json.loads((run_dir / "rank-0.pid").read_text())
    assert pid["shim_pid"] == h.data["ranks"][0]["pid"] and pid["child_pid"] != pid["shim_pid"]
    assert not [p for p in run_dir.iterdir() if p.name.endswith(".tmp")]
    wait_for(lambda: not procs.is_alive(pid["shim_pid"], pid["shim_start"]), what="the shim to exit")
    assert not stat.S_IMODE((run_dir / "rank-0.log").stat().st_mode) & 0o002


def test_signals_to_the_own_group_spare_the_supervisor(launch, runtime) -> None:
    h = launch(command=["sh", "-c", "trap '' USR1 HUP; kill -USR1 0; kill -HUP 0; echo survived"])
    obs = wait_terminal(runtime, h)
    assert (obs.phase, obs.exit_code) == (Phase.SUCCEEDED, 0)  # not LOST: the shim outlived the signals
    assert _log(runtime, h) == b"survived\n"
    # ... and the command still has default dispositions (SIGINT kills it), not ignored ones
    h = launch(command=["sh", "-c", "kill -INT $$; echo not reached"])
    obs = wait_terminal(runtime, h)
    assert (obs.phase, obs.exit_code) == (Phase.FAILED, 130)


class _ShimThatFinishesWhilePolled:
    """A supervisor that starts its command, records its exit and exits in the instant the launcher polls it."""

    def __init__(self, rd: RunDir, rank: int) -> None:
        self.rd, self.rank, self.returncode = rd, rank, None

    def poll(self) -> int | None:
        if self.returncode is None:
            write_json_atomic(self.rd.pidfile(self.rank), {"shim_pid": 1, "child_pid": 2})
            write_json_atomic(self.rd.exitfile(self.rank), {"returncode": 0})
            self.returncode = 0
        return self.returncode


def test_a_command_that_ends_while_the_launcher_looks_has_started(tmp_path) -> None:
    rd = RunDir(tmp_path)
    (tmp_path / "rank-0.log").write_bytes(b"")
    # regression: the exit was seen before the exit record was read again, and a fast `true` failed its launch
    LocalRuntime._await_started(rd, [(0, _ShimThatFinishesWhilePolled(rd, 0), None)], "true")  # type: ignore[list-item]


def test_a_supervisor_that_exits_without_starting_fails_the_launch(tmp_path) -> None:
    class Died:
        returncode = 1

        def poll(self) -> int:
            return 1

    rd = RunDir(tmp_path)
    (tmp_path / "rank-0.log").write_bytes(b"shim: bad arguments\n")
    with pytest.raises(LaunchError, match="bad arguments") as failed:
        LocalRuntime._await_started(rd, [(0, Died(), None)], "true")  # type: ignore[list-item]
    assert failed.value.reason == "SupervisorFailed"
