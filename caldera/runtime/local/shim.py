"""The supervisor of one rank: ``python -I -c <bootstrap> --run-dir D --rank R`` (see ``launchfile``).

The runtime starts it as root with a fixed environment, in a new session, so it is the leader of a process group
that also holds the command and everything the command starts, and it outlives the server. What the rank runs --
command, environment, working directory, uid -- it reads from the root-only launch file, never from its own
arguments or environment. It

* records its pid, then starts the command (stdout/stderr are the rank's log, inherited from the runtime) -- as the
  job owner's uid with no supplementary groups, no capabilities and no_new_privs when the launch names a uid, while
  the shim itself stays root to signal the job and write its records where the job cannot. The job's environment
  is applied only at the command's own exec;
* when the launch asks for a private view (a root server always does), forks the rank's init into a new PID
  namespace (see ``view``): as root it mounts the job's own /tmp, /dev/shm and /proc, drops privileges, starts the
  command and reaps orphans; when the command ends it reports how over a pipe and exits, and the kernel kills
  whatever is left in the namespace. The init, PID 1 there, ignores every signal but SIGKILL from the host, so the
  command and the job cannot signal it, and a stop's SIGTERM reaches the command directly through the group;
* on SIGTERM forwards SIGTERM to its whole process group (grandchildren included) and, when the run directory
  holds a kill deadline (stop.json / gang-failure.json), SIGKILLs the rest of the job at that time -- so the
  SIGKILL of a stop happens even if the server died in between;
* when the command ends, SIGKILLs leftovers (background children of the command; Jupyter kernels, which live in
  their own sessions and are found by CALDERA_RUN_TAG), then writes rank-<r>.exit atomically;
* in a distributed job, when its command fails, asks every sibling rank's shim to stop (gang failure).

Standard library only, and nothing heavy imported: one of these starts per rank.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

from caldera.runtime.local import launchfile, procs, view
from caldera.runtime.local.launchfile import Launch
from caldera.runtime.local.rundir import RunDir, create_json_exclusive, read_json, write_json_atomic


def _ignore(signum, frame) -> None:  # noqa: ANN001
    pass


_PR_SET_NO_NEW_PRIVS = 38
# the shim's own handlers; its forked init puts them back to the default, which for PID 1 means "not delivered"
_HANDLED = (
    signal.SIGTERM,
    signal.SIGALRM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)


def _lock_down(workdir: str) -> None:
    """In the child, after it became the job's uid: no setuid binary can raise it again, and its working
    directory is made and entered as that uid (so a symlink the job planted gives it nothing it did not have)."""
    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    os.makedirs(workdir, exist_ok=True)
    os.chdir(workdir)


def _drop_privileges(launch: Launch) -> None:
    if launch.uid is None:
        os.chdir(launch.workdir)
        return
    os.setgroups([])
    os.setresgid(launch.gid, launch.gid, launch.gid)  # type: ignore[arg-type]
    os.setresuid(launch.uid, launch.uid, launch.uid)
    os.umask(0o022)
    _lock_down(launch.workdir)


def _spawn_error(exc: BaseException, at_exec: bool) -> dict[str, Any]:
    """How starting the command failed; ``exec_errno`` when the exec itself did (ENOENT: no such command)."""
    report: dict[str, Any] = {"spawn_error": str(exc)}
    if at_exec and isinstance(exc, OSError):
        report["exec_errno"] = exc.errno
    return report


def _init(launch: Launch, report: int) -> None:
    """PID 1 of the rank's PID namespace (a fork of the shim, root until it drops privileges); never returns."""
    code = 0
    try:
        for sig in _HANDLED:
            signal.signal(sig, signal.SIG_DFL)
        out = os.fdopen(report, "w")

        def say(msg: dict[str, Any]) -> None:
            out.write(json.dumps(msg) + "\n")
            out.flush()

        try:
            uid = os.getuid() if launch.uid is None else launch.uid
            view.enter(launch.private_tmp, uid, list(launch.keep), list(launch.mounts))  # type: ignore[arg-type]
            _drop_privileges(launch)
        except (OSError, ValueError) as exc:
            say(_spawn_error(exc, at_exec=False))
            os._exit(127)
        try:
            cmd = subprocess.Popen(launch.argv, env=launch.env, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.SubprocessError) as exc:
            say(_spawn_error(exc, at_exec=True))
            os._exit(127)
        say({"started": True})
        while True:  # PID 1 adopts every orphan of the job: reap them all until the command ends
            pid, status = os.waitpid(-1, 0)
            if pid == cmd.pid:
                say({"status": status})
                break
    except BaseException:  # noqa: BLE001 - whatever happened, this fork of the shim must not go on as the shim
        code = 126
    os._exit(code)


class _Namespaced:
    """The rank's init in its own PID namespace, seen from the shim like the Popen of a plain command."""

    def __init__(self, launch: Launch):
        r, w = os.pipe()
        view.new_pid_namespace()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            _init(launch, w)
        os.close(w)
        self.pid = pid
        self._report = os.fdopen(r)
        first = self._message()
        if first is None or "spawn_error" in first:
            os.waitpid(pid, 0)
            raise _SpawnFailed(first or {"spawn_error": "the rank's init ended before starting the command"})
        # the command's pid as the host sees it (gone already if it ended at once: then the init's)
        self.command_pid = next(iter(procs.children(pid)), pid)

    def _message(self) -> dict[str, Any] | None:
        line = self._report.readline()
        return json.loads(line) if line else None

    def wait(self) -> int:
        _, status = os.waitpid(self.pid, 0)
        last = self._message()  # how the command ended; none if the init itself was killed (SIGKILL of a stop)
        return os.waitstatus_to_exitcode(last["status"] if last else status)


class _SpawnFailed(Exception):
    def __init__(self, report: dict[str, Any]):
        super().__init__(report["spawn_error"])
        self.report = report


class Supervisor:
    def __init__(self, run_dir: RunDir, rank: int, launch: Launch):
        self.rd = run_dir
        self.rank = rank
        self.launch = launch
        self.child: subprocess.Popen[bytes] | _Namespaced | None = None
        self.term_requested = False
        self.forwarded = False
        self.pid = os.getpid()
        self.start = procs.start_time(self.pid)
        self.tag = launch.tag

    # -- signals ---------------------------------------------------------------------------------------------
    def _on_term(self, signum, frame) -> None:  # noqa: ANN001
        self.term_requested = True
        if self.child is not None:
            self._forward_term()

    def _forward_term(self) -> None:
        self.forwarded = True
        # ignore our own copy of the group-wide signal, or we would forward it again
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            os.killpg(os.getpgrp(), signal.SIGTERM)
        finally:
            signal.signal(signal.SIGTERM, self._on_term)
        self._arm_deadline()

    def _arm_deadline(self) -> None:
        kill_at = self.rd.kill_deadline()
        if kill_at is not None:
            signal.setitimer(signal.ITIMER_REAL, max(0.01, kill_at - time.time()))

    def _on_deadline(self, signum, frame) -> None:  # noqa: ANN001
        self._kill_leftovers()

    def _kill_leftovers(self) -> None:
        procs.kill_all(procs.job_processes({os.getpgrp()}, tag=self.tag))

    # -- life cycle ------------------------------------------------------------------------------------------
    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGALRM, self._on_deadline)
        # a command may signal its own process group (``kill -USR1 0``); that must not kill its supervisor. A
        # no-op handler, not SIG_IGN: caught signals revert to their default in the command at exec, ignored
        # ones would stay ignored there
        for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, _ignore)
        # written before the stop check below: a failing sibling that does not see this file yet must have
        # created gang-failure.json after we looked, so one of us always notices the other
        write_json_atomic(self.rd.pidfile(self.rank), {"shim_pid": self.pid, "shim_start": self.start})
        if self.term_requested or self.rd.stop.exists() or self.rd.gang_failure.exists():
            self._record(-signal.SIGTERM, reason="StoppedBeforeStart")
            return 0
        try:
            self.child = self._start_child()
        except (OSError, subprocess.SubprocessError, _SpawnFailed) as exc:
            # a plain Popen fails in its preexec step (as the job's uid), in chdir (named by the directory) or at exec
            at_exec = isinstance(exc, OSError) and exc.filename not in (None, self.launch.workdir)
            report = exc.report if isinstance(exc, _SpawnFailed) else _spawn_error(exc, at_exec)
            print(f"caldera: cannot start {self.launch.argv[0]!r}: {exc}", file=sys.stderr, flush=True)
            self._record(127, reason="SpawnError", spawn=report)
            return 0
        command_pid = self.child.command_pid if isinstance(self.child, _Namespaced) else self.child.pid
        write_json_atomic(
            self.rd.pidfile(self.rank),
            {
                "shim_pid": self.pid,
                "shim_start": self.start,
                "init_pid": self.child.pid,
                "child_pid": command_pid,
                "child_start": procs.start_time(command_pid),
            },
        )
        if self.term_requested and not self.forwarded:
            self._forward_term()
        rc = self.child.wait()
        signal.setitimer(signal.ITIMER_REAL, 0)
        self._kill_leftovers()
        self._record(rc)
        if rc != 0 and self.launch.world_size > 1:
            self._gang_stop(rc)
        return 0

    def _start_child(self) -> subprocess.Popen[bytes] | _Namespaced:
        launch = self.launch
        if launch.private_tmp is not None:
            return _Namespaced(launch)
        if launch.uid is None:
            return subprocess.Popen(launch.argv, cwd=launch.workdir, env=launch.env, stdin=subprocess.DEVNULL)
        # the shim stays root (it must signal and record the job); the command becomes the owner with no
        # supplementary groups, and a setuid-from-root drops every capability
        return subprocess.Popen(
            launch.argv,
            env=launch.env,
            stdin=subprocess.DEVNULL,
            user=launch.uid,
            group=launch.gid,
            extra_groups=[],
            umask=0o022,
            preexec_fn=lambda: _lock_down(launch.workdir),
        )

    def _record(self, returncode: int, reason: str = "", spawn: dict[str, Any] | None = None) -> None:
        rec = {
            "returncode": returncode,
            "exit_code": returncode if returncode >= 0 else 128 - returncode,
            "signal": signal.Signals(-returncode).name if returncode < 0 else None,
            "ended_at": time.time(),
            "reason": reason,
        }
        if spawn is not None:
            rec.update(spawn)
        write_json_atomic(self.rd.exitfile(self.rank), rec)

    def _gang_stop(self, returncode: int) -> None:
        if self.rd.stop.exists():
            return  # the runtime is stopping the job: our failure is a consequence, not the cause
        exit_code = returncode if returncode >= 0 else 128 - returncode
        now = time.time()
        first = create_json_exclusive(
            self.rd.gang_failure,
            {"rank": self.rank, "exit_code": exit_code, "at": now, "kill_at": now + self.launch.gang_grace_s},
        )
        if not first:
            return  # an earlier failing rank is already stopping everyone
        for r in range(self.launch.world_size):
            if r == self.rank or self.rd.exitfile(r).exists():
                continue
            info = read_json(self.rd.pidfile(r)) or {}
            procs.signal_verified(info.get("shim_pid"), info.get("shim_start"), signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="caldera-shim")
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--rank", type=int, default=0)
    args = ap.parse_args(argv)
    rd = RunDir(args.run_dir)
    return Supervisor(rd, args.rank, launchfile.read(rd, args.rank)).run()


if __name__ == "__main__":
    sys.exit(main())
