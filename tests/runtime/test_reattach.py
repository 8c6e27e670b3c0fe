"""Re-attach after a server restart, and telling a lost job from a finished one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from caldera.config import Settings
from caldera.core.spec import JobSpec
from caldera.runtime.base import Handle, LaunchRequest, Phase
from caldera.runtime.local import procs
from caldera.runtime.local.runtime import LocalRuntime

from .conftest import host_pid, wait_for, wait_terminal

REPO = Path(__file__).resolve().parents[2]


def test_a_new_runtime_reattaches_to_a_running_job(launch, settings, tmp_path) -> None:
    a = LocalRuntime(settings)
    work = tmp_path / "work" / "long"
    h = launch(job_id="long", rt=a, command=["sh", "-c", "touch up; while [ ! -e go ]; do sleep 0.05; done; exit 0"])
    wait_for(lambda: (work / "up").exists())
    data = json.loads(json.dumps(h.data))  # what the server stored
    del a  # the server is gone
    b = LocalRuntime(settings)
    handle = Handle("long", 1, data)
    assert b.observe(handle).phase is Phase.RUNNING
    assert b.observe(Handle("long", 1)).phase is Phase.RUNNING  # even without handle.data
    (work / "go").touch()
    obs = wait_terminal(b, handle)
    assert (obs.phase, obs.exit_code) == (Phase.SUCCEEDED, 0)


def test_jobs_survive_a_sigkilled_server(settings, tmp_path) -> None:
    """A real server process launches a job and is SIGKILLed; the job keeps running and is found again."""
    work = tmp_path / "work" / "orphan"
    server = textwrap.dedent(f"""
        import json, sys
        from pathlib import Path
        from caldera.config import Settings
        from caldera.core.spec import JobSpec
        from caldera.runtime.base import LaunchRequest
        from caldera.runtime.local.runtime import LocalRuntime
        rt = LocalRuntime(Settings(data_dir=Path({str(settings.data_dir)!r})))
        spec = JobSpec(name="orphan", command=["sh", "-c", "touch up; while [ ! -e go ]; do sleep 0.05; done; exit 7"])
        h = rt.launch(LaunchRequest("orphan", 1, spec, (), Path({str(work)!r})))
        print(json.dumps(h.data), flush=True)
        sys.stdin.read()
    """)
    proc = subprocess.Popen([sys.executable, "-c", server], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        data = json.loads(proc.stdout.readline())
        wait_for(lambda: (work / "up").exists())
    finally:
        proc.kill()
        proc.wait()
    b = LocalRuntime(settings)
    h = Handle("orphan", 1, data)
    try:
        assert b.observe(h).phase is Phase.RUNNING
        (work / "go").touch()
        obs = wait_terminal(b, h)
        assert (obs.phase, obs.exit_code) == (Phase.FAILED, 7)
    finally:
        b.stop(h, 0)


def test_a_killed_supervisor_means_lost(launch, runtime, settings, tmp_path) -> None:
    work = tmp_path / "work" / "victim"
    h = launch(job_id="victim", command=["sh", "-c", "sleep 100 & echo $! > gc.pid; touch up; wait"])
    wait_for(lambda: (work / "up").exists())
    gc = host_pid(h, int((work / "gc.pid").read_text()))
    gc_start = procs.start_time(gc)
    os.killpg(h.data["ranks"][0]["pid"], signal.SIGKILL)  # shim, command and grandchild: no exit record
    b = LocalRuntime(settings)
    obs = wait_terminal(b, h)
    assert (obs.phase, obs.reason) == (Phase.LOST, "ProcessGone")
    assert not (settings.runs_dir / "victim" / "1" / "rank-0.exit").exists()
    wait_for(lambda: not procs.is_alive(gc, gc_start), timeout=10)


def test_only_the_shim_killed_still_cleans_up_the_command(launch, runtime, tmp_path) -> None:
    work = tmp_path / "work" / "headless"
    h = launch(job_id="headless", command=["sh", "-c", "touch up; exec sleep 100"])
    wait_for(lambda: (work / "up").exists())
    child = json.loads((Path(h.data["run_dir"]) / "rank-0.pid").read_text())
    os.kill(h.data["ranks"][0]["pid"], signal.SIGKILL)
    obs = wait_terminal(runtime, h)
    assert obs.phase is Phase.LOST
    # a lost job must not keep its GPUs: the orphaned command is killed too
    wait_for(lambda: not procs.is_alive(child["child_pid"], child["child_start"]), timeout=10)


def test_pid_reuse_is_not_mistaken_for_the_job(runtime, tmp_path) -> None:
    """The recorded pid now belongs to another process (here: this test) with a different start time."""
    run_dir = tmp_path / "fake-run"
    run_dir.mkdir()
    me = os.getpid()
    data = {
        "run_dir": str(run_dir),
        "kind": "batch",
        "world_size": 1,
        "ranks": [{"rank": 0, "pid": me, "start": procs.start_time(me) - 1}],
        "netns": False,
    }
    obs = runtime.observe(Handle("reused", 1, data))
    assert (obs.phase, obs.reason) == (Phase.LOST, "ProcessGone")
    assert procs.is_alive(me, procs.start_time(me))  # and nothing was killed by mistake


def test_observe_is_cheap(launch, runtime, tmp_path) -> None:
    work = tmp_path / "work" / "cheap"
    h = launch(job_id="cheap", kind="distributed", replicas=4, command=["sh", "-c", "touch up$RANK; sleep 30"])
    wait_for(lambda: all((work / f"up{r}").exists() for r in range(4)))
    fresh = LocalRuntime(runtime.settings)
    fresh.observe(h)
    t0 = time.perf_counter()
    for _ in range(200):
        assert fresh.observe(h).phase is Phase.RUNNING
    per_call = (time.perf_counter() - t0) / 200
    assert per_call < 0.005, per_call  # ~a few /proc reads per rank; far below the 1 s observe period


def _orphan_rank(tag: str) -> subprocess.Popen:
    """A rank a crashed server started but never recorded (no meta.json)."""
    return subprocess.Popen(["sleep", "60"], env={**os.environ, procs.TAG_VAR: tag}, start_new_session=True)


def test_an_interrupted_launch_is_cleaned_up(settings) -> None:
    (settings.runs_dir / "cut" / "1").mkdir(parents=True)
    orphan = _orphan_rank("cut/1/0")
    try:
        obs = LocalRuntime(settings).observe(Handle("cut", 1))
        assert (obs.phase, obs.reason) == (Phase.LOST, "NotFound")
        assert orphan.wait(timeout=10) == -signal.SIGKILL
    finally:
        orphan.kill()


def test_relaunching_after_an_interrupted_launch_starts_clean(launch, runtime, settings) -> None:
    stale = settings.runs_dir / "again" / "1"
    stale.mkdir(parents=True)
    (stale / "rank-0.exit").write_text('{"exit_code": 1}')
    orphan = _orphan_rank("again/1/0")
    try:
        h = launch(job_id="again", command=["true"])
        assert orphan.wait(timeout=10) == -signal.SIGKILL
        assert wait_terminal(runtime, h).phase is Phase.SUCCEEDED  # not the stale exit record
        assert [p.name for p in stale.parent.iterdir() if p.name.startswith("1.stale-")]
    finally:
        orphan.kill()


def test_a_relative_data_dir_still_reattaches(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    settings = Settings(data_dir=Path("rel-data"))
    rt = LocalRuntime(settings)
    h = rt.launch(LaunchRequest("rel", 1, JobSpec(name="rel", command=["sh", "-c", "echo here"]), (), Path("rel-work")))
    assert Path(h.data["run_dir"]).is_absolute()
    monkeypatch.chdir("/")
    b = LocalRuntime(settings.model_copy(update={"data_dir": tmp_path / "rel-data"}))
    assert wait_terminal(b, h).phase is Phase.SUCCEEDED
    assert b"".join(b.logs(h)) == b"here\n"
    assert (tmp_path / "rel-work").is_dir()
