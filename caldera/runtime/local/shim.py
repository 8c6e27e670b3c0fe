"""The supervisor of one rank: ``python -m caldera.runtime.local.shim --run-dir D --rank R --workdir W -- argv...``

The runtime starts it in a new session, so it is the leader of a process group that also holds the command and
everything the command starts, and it outlives the server. It

* records its pid, then starts the command (stdout/stderr are the rank's log, inherited from the runtime) -- as the
  job owner's uid with no supplementary groups, no capabilities and no_new_privs when given ``--uid``, while the
  shim itself stays root to signal the job and write its records where the job cannot;
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
import os
import signal
import subprocess
import sys
import time

from caldera.runtime.local import procs
from caldera.runtime.local.rundir import RunDir, create_json_exclusive, read_json, write_json_atomic


def _ignore(signum, frame) -> None:  # noqa: ANN001
    pass


_PR_SET_NO_NEW_PRIVS = 38


def _lock_down(workdir: str) -> None:
    """In the child, after it became the job's uid: no setuid binary can raise it again, and its working
    directory is made and entered as that uid (so a symlink the job planted gives it nothing it did not have)."""
    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    os.makedirs(workdir, exist_ok=True)
    os.chdir(workdir)


class Supervisor:
    def __init__(
        self,
        run_dir: RunDir,
        rank: int,
        workdir: str,
        argv: list[str],
        world_size: int,
        gang_grace_s: float,
        uid: int | None = None,
        gid: int | None = None,
    ):
        self.rd = run_dir
        self.uid, self.gid = uid, gid
        self.rank = rank
        self.workdir = workdir
        self.argv = argv
        self.world_size = world_size
        self.gang_grace_s = gang_grace_s
        self.child: subprocess.Popen[bytes] | None = None
        self.term_requested = False
        self.forwarded = False
        self.pid = os.getpid()
        self.start = procs.start_time(self.pid)
        self.tag = os.environ.get(procs.TAG_VAR)

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
        except (OSError, subprocess.SubprocessError) as exc:
            print(f"caldera: cannot start {self.argv[0]!r}: {exc}", file=sys.stderr, flush=True)
            self._record(127, reason="SpawnError", spawn_error=str(exc))
            return 0
        write_json_atomic(
            self.rd.pidfile(self.rank),
            {
                "shim_pid": self.pid,
                "shim_start": self.start,
                "child_pid": self.child.pid,
                "child_start": procs.start_time(self.child.pid),
            },
        )
        if self.term_requested and not self.forwarded:
            self._forward_term()
        rc = self.child.wait()
        signal.setitimer(signal.ITIMER_REAL, 0)
        self._kill_leftovers()
        self._record(rc)
        if rc != 0 and self.world_size > 1:
            self._gang_stop(rc)
        return 0

    def _start_child(self) -> subprocess.Popen[bytes]:
        if self.uid is None:
            return subprocess.Popen(self.argv, cwd=self.workdir, stdin=subprocess.DEVNULL)
        # the shim stays root (it must signal and record the job); the command becomes the owner with no
        # supplementary groups, and a setuid-from-root drops every capability
        return subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            user=self.uid,
            group=self.gid,
            extra_groups=[],
            umask=0o022,
            preexec_fn=lambda: _lock_down(self.workdir),
        )

    def _record(self, returncode: int, reason: str = "", spawn_error: str | None = None) -> None:
        rec = {
            "returncode": returncode,
            "exit_code": returncode if returncode >= 0 else 128 - returncode,
            "signal": signal.Signals(-returncode).name if returncode < 0 else None,
            "ended_at": time.time(),
            "reason": reason,
        }
        if spawn_error is not None:
            rec["spawn_error"] = spawn_error
        write_json_atomic(self.rd.exitfile(self.rank), rec)

    def _gang_stop(self, returncode: int) -> None:
        if self.rd.stop.exists():
            return  # the runtime is stopping the job: our failure is a consequence, not the cause
        exit_code = returncode if returncode >= 0 else 128 - returncode
        first = create_json_exclusive(
            self.rd.gang_failure,
            {"rank": self.rank, "exit_code": exit_code, "at": time.time(), "kill_at": time.time() + self.gang_grace_s},
        )
        if not first:
            return  # an earlier failing rank is already stopping everyone
        for r in range(self.world_size):
            if r == self.rank or self.rd.exitfile(r).exists():
                continue
            info = read_json(self.rd.pidfile(r)) or {}
            procs.signal_verified(info.get("shim_pid"), info.get("shim_start"), signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="caldera-shim")
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--world-size", type=int, default=1)
    ap.add_argument("--gang-grace", type=float, default=10.0)
    ap.add_argument("--uid", type=int, default=None, help="run the command as this uid (the shim stays root)")
    ap.add_argument("--gid", type=int, default=None)
    ap.add_argument("command", nargs=argparse.REMAINDER)
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("no command")
    sup = Supervisor(
        RunDir(args.run_dir), args.rank, args.workdir, command, args.world_size, args.gang_grace, args.uid, args.gid
    )
    return sup.run()


if __name__ == "__main__":
    sys.exit(main())
