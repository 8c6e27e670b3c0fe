"""stop(): preemption notice, SIGTERM to the whole process group, SIGKILL after the grace."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from caldera.runtime.base import Phase
from caldera.runtime.local import procs
from caldera.runtime.local import runtime as runtime_mod

from .conftest import host_pid, wait_for, wait_terminal

# sh runs a trap only once the foreground command ends, hence the short sleeps in the loops
LOOP = "while :; do sleep 0.1; done"


def _started(path):
    return lambda: path.exists()


def test_sigterm_reaches_a_trapping_command(launch, runtime, tmp_path) -> None:
    work = tmp_path / "work" / "trap"
    h = launch(job_id="trap", command=["sh", "-c", f"trap 'echo got-term > term.txt; exit 0' TERM; touch up; {LOOP}"])
    wait_for(_started(work / "up"), what="the command to start")
    t0 = time.monotonic()
    runtime.stop(h, grace_s=30)
    assert time.monotonic() - t0 < 1.0  # returns at once
    obs = wait_terminal(runtime, h)
    assert (work / "term.txt").read_text() == "got-term\n"
    assert (obs.phase, obs.exit_code) == (Phase.SUCCEEDED, 0)  # it handled SIGTERM and exited cleanly
    assert time.monotonic() - t0 < 20  # nowhere near the 30 s grace


def test_a_command_ignoring_sigterm_is_killed_after_the_grace(launch, runtime, tmp_path) -> None:
    work = tmp_path / "work" / "stubborn"
    h = launch(job_id="stubborn", command=["sh", "-c", f"trap '' TERM; touch up; {LOOP}"])
    wait_for(_started(work / "up"))
    t0 = time.monotonic()
    runtime.stop(h, grace_s=1.5)
    assert time.monotonic() - t0 < 1.0
    time.sleep(0.5)
    assert runtime.observe(h).phase is Phase.RUNNING  # still inside its grace
    obs = wait_terminal(runtime, h)
    elapsed = time.monotonic() - t0
    assert 1.4 <= elapsed < 15
    assert (obs.phase, obs.exit_code, obs.reason) == (Phase.FAILED, 137, "Stopped")


def test_the_shim_itself_sigkills_at_the_deadline(launch, runtime, tmp_path, monkeypatch) -> None:
    """The server's backstop thread is not needed: the deadline is kept even if the server died after stop()."""
    monkeypatch.setattr(runtime_mod, "_KILL_MARGIN_S", 3600.0)
    work = tmp_path / "work" / "noback"
    h = launch(job_id="noback", command=["sh", "-c", f"trap '' TERM; touch up; {LOOP}"])
    wait_for(_started(work / "up"))
    t0 = time.monotonic()
    runtime.stop(h, grace_s=1.0)
    obs = wait_terminal(runtime, h)
    assert time.monotonic() - t0 < 15
    assert (obs.phase, obs.exit_code) == (Phase.FAILED, 137)


def test_grandchildren_die_with_the_job(launch, runtime, tmp_path) -> None:
    work = tmp_path / "work" / "tree"
    # one grandchild dies of SIGTERM, the other ignores it and must be SIGKILLed once the command is gone
    h = launch(
        job_id="tree",
        command=["sh", "-c", "sleep 100 & echo $! > gc1.pid; (trap '' TERM; exec sleep 100) & echo $! > gc2.pid; wait"],
    )
    files = [work / "gc1.pid", work / "gc2.pid"]
    wait_for(lambda: all(f.exists() and f.read_text().strip() for f in files), what="grandchildren")
    pids = [host_pid(h, int(f.read_text())) for f in files]
    ident = [(p, procs.start_time(p)) for p in pids]
    assert all(procs.is_alive(p, st) for p, st in ident)
    runtime.stop(h, grace_s=30)
    wait_terminal(runtime, h)
    wait_for(lambda: not any(procs.is_alive(p, st) for p, st in ident), timeout=10, what="grandchildren to die")


def test_background_leftovers_are_killed_when_the_command_exits(launch, runtime, tmp_path) -> None:
    work = tmp_path / "work" / "leftover"
    h = launch(
        job_id="leftover",
        command=["sh", "-c", "sleep 100 & echo $! > gc.pid; until [ -e go ]; do sleep 0.05; done; exit 0"],
    )
    wait_for(lambda: (work / "gc.pid").exists() and (work / "gc.pid").read_text().strip(), what="the leftover")
    pid = host_pid(h, int((work / "gc.pid").read_text()))
    start = procs.start_time(pid)
    assert procs.is_alive(pid, start)
    (work / "go").touch()
    assert wait_terminal(runtime, h).phase is Phase.SUCCEEDED
    wait_for(lambda: not procs.is_alive(pid, start), timeout=10, what="the leftover to die")


def test_preemption_notice_is_written_before_sigterm(launch, runtime, settings, tmp_path) -> None:
    work = tmp_path / "work" / "pre"
    h = launch(
        job_id="pre",
        command=[
            "sh",
            "-c",
            f"trap 'cat \"$CALDERA_PREEMPT_NOTICE\" > seen.txt; exit 0' TERM; "
            f'[ -e "$CALDERA_PREEMPT_NOTICE" ] && echo early > early.txt; touch up; {LOOP}',
        ],
    )
    wait_for(_started(work / "up"))
    notice_file = settings.scratch_dir / "pre.1" / "preempt-notice"
    assert not notice_file.exists() and not (work / "early.txt").exists()
    before = datetime.now(UTC)
    runtime.stop(h, grace_s=20, notice="preempted: a high-priority job needs this GPU")
    assert wait_terminal(runtime, h).phase is Phase.SUCCEEDED
    seen = (work / "seen.txt").read_text()  # what the SIGTERM handler found
    assert seen.startswith("preempted: a high-priority job needs this GPU\n")
    line = next(x for x in seen.splitlines() if x.startswith("deadline: "))
    deadline = datetime.fromisoformat(line.removeprefix("deadline: "))
    assert 15 <= (deadline - before).total_seconds() <= 25


def test_a_notice_that_carries_its_own_deadline_is_written_as_is(launch, runtime, settings) -> None:
    h = launch(job_id="pre2", command=["sleep", "30"])
    text = "preempted: reclaim\ndeadline: 2030-01-01T00:00:00+00:00\n"
    runtime.stop(h, grace_s=0, notice=text)
    wait_terminal(runtime, h)
    assert (settings.scratch_dir / "pre2.1" / "preempt-notice").read_text() == text


def test_stopping_an_ended_job_is_harmless(launch, runtime) -> None:
    h = launch(command=["true"])
    assert wait_terminal(runtime, h).phase is Phase.SUCCEEDED
    runtime.stop(h, grace_s=0)
    assert runtime.observe(h).phase is Phase.SUCCEEDED
