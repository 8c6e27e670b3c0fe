"""The local runtime: jobs run as real processes on this host, each rank under a supervisor shim.

State lives in files (see ``rundir``), so any ``LocalRuntime`` built from the same settings -- e.g. after the server
was SIGKILLed and restarted -- re-attaches to running jobs by reading their run directory. ``Handle.data`` holds

    run_dir      the attempt's run directory (settings.runs_dir/<job_id>/<attempt>)
    kind         "batch" | "distributed" | "jupyter" | "vscode"
    world_size   number of ranks
    ranks        [{"rank": r, "pid": shim pid (= its process group), "start": /proc start time}]
    netns        true when the ranks share a private network namespace
    scratch      the attempt's job-owned directory (see ``owner``): preemption notice, the lab's socket, the
                 owner's SSH public keys (authorized_keys, named by CALDERA_SSH_AUTHORIZED_KEYS), and under a root
                 server ``tmp``, the job's own /tmp (see ``view``)
    run_as       [uid, gid] the commands run as, or null (the server's own user)
    socket, base_url   (jupyter, vscode) where Lab (code-server) listens; the platform's copy of its token (password)
                 is <run_dir>/jupyter.token, and it connects through <run_dir>/lab.sock (see ``jupyter.pin_socket``)
    lab_runtime  (jupyter) Jupyter's runtime directory (kernel connection files and sockets), relative to scratch

A handle with empty ``data`` works too: it is read back from <run_dir>/meta.json.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import caldera
from caldera.config import Settings
from caldera.core.cluster import Device, Node
from caldera.core.spec import JobKind
from caldera.ports import unused_port
from caldera.runtime.base import (
    Endpoint,
    ExecError,
    Handle,
    LaunchError,
    LaunchRequest,
    Observation,
    Phase,
    ProcessUsage,
    RunAs,
)
from caldera.runtime.exec_process import ExecProcess, spawn, terminal_name
from caldera.runtime.local import code_server, jupyter, launchfile, netns, owner, procs, session_servers, view
from caldera.runtime.local.gpus import discover_gpus
from caldera.runtime.local.launchfile import Launch
from caldera.runtime.local.log_follow import follow_file
from caldera.runtime.local.rundir import RunDir, read_json, write_json_atomic, write_text_atomic
from caldera.runtime.local.session_servers import SessionLogins
from caldera.runtime.local.stop_record import NOTICE_FILE, record_stop

# the shim's Python runs isolated (-I: no environment variable, user site or working directory alters it) and
# imports this very checkout of caldera, named here by the platform
_PKG_ROOT = Path(caldera.__file__).resolve().parents[1]
_SHIM_MAIN = (
    f"import sys; sys.path.insert(0, {str(_PKG_ROOT)!r}); from caldera.runtime.local.shim import main; sys.exit(main())"
)
_ENTER_MAIN = (
    f"import sys; sys.path.insert(0, {str(_PKG_ROOT)!r}); from caldera.runtime.local.enter import main; "
    "sys.exit(main(int(sys.argv[1])))"
)
_LAB_RUNTIME = "jupyter-runtime"
_START_TIMEOUT_S = 60.0  # generous: on a loaded host, python + nsenter start-up can take seconds per rank
_KILL_MARGIN_S = 1.0  # the shims SIGKILL at the deadline themselves; the runtime's backstop comes this late
_MAX_FINAL = 10_000
_Key = tuple[str, int]
# what a job inherits from the server's environment: how to find programs, locale, and how this host reaches
# package indexes. Nothing else: the server's environment may hold credentials
_PASS_ENV = {
    "PATH",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TERM",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "PIP_CERT",
    "PIP_INDEX_URL",
    "PIP_EXTRA_INDEX_URL",
    "PIP_FIND_LINKS",
    "PIP_DEFAULT_TIMEOUT",
    "PIP_DISABLE_PIP_VERSION_CHECK",
    "PYENV_ROOT",
    "PYENV_VERSION",
    "CUDA_HOME",
    "LD_LIBRARY_PATH",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
}
_PASS_PREFIXES = ("LC_", "OPENBLAS_", "OMP_", "MKL_", "NVIDIA_")


def _meminfo_mib() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return 0


def _exit_message(rec: dict[str, Any]) -> str:
    sig = f" ({rec['signal']})" if rec.get("signal") else ""
    return f"exited with code {rec['exit_code']}{sig}"


class LocalRuntime:
    name = "local"
    job_python = sys.executable  # runs in a job too (caldera ssh's server): the platform's Python, with asyncssh

    def __init__(self, settings: Settings):
        self.settings = settings
        self._gpus: tuple[Device, ...] | None = None
        self._lock = threading.Lock()
        self._meta: dict[_Key, dict[str, Any]] = {}
        self._exits: dict[_Key, dict[int, dict[str, Any]]] = {}  # exit records never change once written
        self._final: dict[_Key, Observation] = {}  # all that is kept of a job once it ended
        self._tokens: dict[_Key, str] = {}
        self._logins = SessionLogins()  # Lab's (code-server's) login cookie, for the proxy
        self._children: dict[_Key, list[subprocess.Popen[bytes]]] = {}  # our shims, reaped so no zombies pile up
        self._launching: set[_Key] = set()

    # -- nodes -----------------------------------------------------------------------------------------------
    def nodes(self) -> list[Node]:
        if self._gpus is None:  # hardware does not change under a running server; NVML init is not free
            self._gpus = discover_gpus(self.settings)
        s = self.settings
        return [
            Node(
                name=s.node_name or socket.gethostname(),
                cpu=float(s.node_cpu or os.cpu_count() or 1),
                memory_mib=int(s.node_memory_mib or _meminfo_mib()),
                gpus=self._gpus,
            )
        ]

    # -- launch ----------------------------------------------------------------------------------------------
    def launch(self, req: LaunchRequest) -> Handle:
        if not req.job_id or "/" in req.job_id or req.job_id in (".", "..") or "\0" in req.job_id:
            raise LaunchError("BadJobId", f"job id {req.job_id!r} cannot name a directory")
        key = (req.job_id, req.attempt)
        with self._lock:
            if key in self._launching:
                raise LaunchError("AlreadyLaunching", f"attempt {req.attempt} of job {req.job_id} is being launched")
            self._launching.add(key)
            self._forget(key)
        try:
            rd = self._prepare_run_dir(req)
            started: list[tuple[int, subprocess.Popen[bytes], int | None]] = []
            try:
                data = self._start(req, rd, started)
            except Exception as exc:
                self._abort(rd, req, started)
                if isinstance(exc, LaunchError):
                    raise
                raise LaunchError("StartFailed", f"cannot start job: {exc}") from exc
            write_json_atomic(rd.meta, data)  # from here on, any runtime instance can re-attach
            with self._lock:
                self._meta[key] = data
                self._children[key] = [p for _, p, _ in started]
            return Handle(req.job_id, req.attempt, dict(data))
        finally:
            with self._lock:
                self._launching.discard(key)

    def _forget(self, key: _Key) -> None:
        self._meta.pop(key, None)
        self._final.pop(key, None)
        self._tokens.pop(key, None)
        self._logins.forget(key)
        self._exits.pop(key, None)

    def _start(
        self, req: LaunchRequest, rd: RunDir, started: list[tuple[int, subprocess.Popen[bytes], int | None]]
    ) -> dict[str, Any]:
        """Start every rank, appending to ``started`` as it goes (so a failure can kill exactly those)."""
        spec = req.spec
        workdir = self._workdir(req)
        private = os.geteuid() == 0  # a root server gives every rank its own view of the host (see ``view``)
        if req.mounts and not private:
            raise LaunchError("MountsUnsupported", "storage spaces are mounted into process jobs by a root server only")
        outside = [at for _, at, _ in req.mounts if view.private_top(at) is None]
        if outside:
            raise LaunchError(
                "MountPointRefused", f"{outside[0]}: process jobs see storage spaces only below /tmp or /var/tmp"
            )
        # the job's own /tmp in its scratch; a lab's runtime directory there (or, without one, in its scratch)
        lab_runtime = Path("tmp", _LAB_RUNTIME) if private else Path("runtime")
        inside = ("tmp",) if private else ()
        if spec.kind is JobKind.JUPYTER:
            inside += (str(lab_runtime),)
        scratch = self._prepare_scratch(req, inside)
        world = spec.world_size if spec.kind is JobKind.DISTRIBUTED else 1
        data: dict[str, Any] = {
            "run_dir": str(rd.path),
            "kind": spec.kind.value,
            "world_size": world,
            "scratch": str(scratch),
            "run_as": [req.run_as.uid, req.run_as.gid] if req.run_as else None,
            "workdir": str(workdir),
            "private": private,
            "exec_env": self._exec_env(req),
        }
        base_env = self._base_env(req, scratch)
        base_env.update(owner.authorized_keys(scratch, req.authorized_keys, req.run_as))

        if spec.kind is JobKind.JUPYTER:
            base_url = jupyter.normalise_base_url(req.base_url or "/")
            token = secrets.token_hex(24)
            write_text_atomic(rd.token, token, mode=0o600)
            owner.write_owned(scratch / "lab-token", token, req.run_as)  # deleted once Lab read it
            # connection files (kernel HMAC keys), jpserver-*.json, the cookie secret: the job's alone. In its own
            # /tmp, its kernels talk over Unix sockets there (a short path: a socket's holds at most 107 bytes)
            seen_as = Path("/tmp", _LAB_RUNTIME) if private else scratch / lab_runtime
            base_env.pop("JUPYTER_TOKEN", None)  # would take precedence over our token file
            base_env.update(JUPYTER_TOKEN_FILE=str(scratch / "lab-token"), JUPYTER_RUNTIME_DIR=str(seen_as))
            sock = scratch / "lab.sock"
            as_root = req.run_as is None and os.geteuid() == 0
            # spec.command is never used: it could listen elsewhere
            argv = jupyter.lab_argv(sock, base_url, workdir, as_root, ipc_kernels=private)
            data.update(socket=str(sock), base_url=base_url, lab_runtime=str(lab_runtime))
        elif spec.kind is JobKind.VSCODE:
            exe = self.settings.code_server
            if not os.access(exe, os.X_OK):
                raise LaunchError("CodeServerMissing", f"code-server is not installed at {exe}")
            shell = shutil.which("bash") or "/bin/sh"
            argv, sock = code_server.prepare(str(exe), req, rd, scratch, workdir, base_env, shell)
            data.update(socket=str(sock), base_url="/")
        else:
            argv = list(spec.command or [])
        if not argv:
            raise LaunchError("NoCommand", "no command")

        holder = None
        if spec.kind is JobKind.DISTRIBUTED and self.settings.isolate_distributed_network and netns.available():
            holder = netns.start_holder()
        try:
            master_port = unused_port() if spec.kind is JobKind.DISTRIBUTED else 0
            for r in range(world):
                env = dict(base_env)
                replica = r // spec.procs_per_replica
                env.update(self._rank_env(req, r, replica))
                if spec.kind is JobKind.DISTRIBUTED:
                    env.update(
                        MASTER_ADDR="127.0.0.1",
                        MASTER_PORT=str(master_port),
                        WORLD_SIZE=str(world),
                        RANK=str(r),
                        LOCAL_RANK=str(r % spec.procs_per_replica),
                        NODE_RANK=str(replica),
                        GROUP_RANK=str(replica),
                        LOCAL_WORLD_SIZE=str(spec.procs_per_replica),
                    )
                if holder:
                    # only lo exists in there; gloo/NCCL would otherwise pick the interface of the host name
                    for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
                        if var not in spec.env:
                            env[var] = "lo"
                launch = Launch(
                    argv=argv,
                    env=env,
                    workdir=str(workdir),
                    tag=env[procs.TAG_VAR],
                    world_size=world,
                    gang_grace_s=self.settings.cancel_grace_s,
                    uid=req.run_as.uid if req.run_as else None,
                    gid=req.run_as.gid if req.run_as else None,
                    # the platform's part resolved (the shim follows no symlink on the way), the job's part as is
                    private_tmp=str(self.settings.scratch_dir.resolve() / scratch.name / "tmp") if private else None,
                    keep=tuple(os.path.abspath(p) for p in (req.home or workdir, scratch)),
                    mounts=req.mounts,
                )
                prefix = holder.enter_prefix() if holder else []
                proc = self._spawn(rd, r, prefix, launch)
                started.append((r, proc, procs.start_time(proc.pid)))
            self._await_started(rd, started, argv[0])
        finally:
            if holder:  # every rank is inside the namespace now (or dead): they keep it alive themselves
                holder.release()
        data["ranks"] = [{"rank": r, "pid": p.pid, "start": st} for r, p, st in started]
        data["netns"] = holder is not None
        return data

    def _run_dir_path(self, job_id: str, attempt: int) -> Path:
        # absolute: the shims run in another working directory, and meta.json must mean the same after a restart
        return Path(self.settings.runs_dir).resolve() / job_id / str(attempt)

    def _prepare_run_dir(self, req: LaunchRequest) -> RunDir:
        path = self._run_dir_path(req.job_id, req.attempt)
        if path.exists():
            old = read_json(path / "meta.json")
            if old and any(procs.is_alive(r["pid"], r["start"]) for r in old.get("ranks", [])):
                raise LaunchError("AlreadyRunning", f"attempt {req.attempt} of job {req.job_id} is already running")
            # a launch interrupted by a server crash (no meta.json) may have left ranks running
            procs.kill_all(procs.job_processes(set(), tag_prefix=f"{req.job_id}/{req.attempt}/"))
            # keep the leftover for diagnosis, out of the way
            path.rename(path.with_name(f"{path.name}.stale-{time.time_ns()}"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir(mode=0o700)  # logs may hold secrets of the job
        return RunDir(path)

    def _workdir(self, req: LaunchRequest) -> Path:
        """The job's working directory. A job with an owner gets it inside the owner's space and makes it itself,
        as that uid (see the shim); the platform makes only the space."""
        workdir = Path(os.path.normpath(req.workdir))
        if req.home is not None:
            home = Path(os.path.normpath(req.home))
            if workdir != home and home not in workdir.parents:
                raise LaunchError("BadWorkdir", f"working directory {workdir} is outside the owner's space {home}")
            owner.platform_dir(home.parent, 0o711)
            owner.owned_dir(home, req.run_as)
        if req.run_as is None:
            workdir = workdir.resolve()
            workdir.mkdir(parents=True, exist_ok=True)
        return workdir

    def _prepare_scratch(self, req: LaunchRequest, inside: tuple[str, ...]) -> Path:
        owner.platform_dir(self.settings.data_dir, 0o711)
        owner.platform_dir(self.settings.scratch_dir, 0o711)
        scratch = self.settings.scratch_dir / f"{req.job_id}.{req.attempt}"
        return owner.owned_dir(scratch, req.run_as, fresh=True, inside=inside)

    @staticmethod
    def _exec_env(req: LaunchRequest) -> dict[str, str]:
        """What every rank's command starts from and a command run in the job later (``exec``) gets whole: the
        server's allowed variables and the owner's identity, none of the job spec's values."""
        env = {k: v for k, v in os.environ.items() if k in _PASS_ENV or k.startswith(_PASS_PREFIXES)}
        if req.home is not None:
            env["HOME"] = str(req.home)
        if req.run_as is not None:
            env.update(USER=req.run_as.name, LOGNAME=req.run_as.name)
        env.update(CALDERA_JOB_ID=req.job_id, CALDERA_ATTEMPT=str(req.attempt))
        return env

    def _base_env(self, req: LaunchRequest, scratch: Path) -> dict[str, str]:
        env = self._exec_env(req)
        env.setdefault("PYTHONUNBUFFERED", "1")  # logs appear as they are written, not when a buffer fills
        env.update(req.spec.env)
        env.update(req.env)  # the platform's variables win over the user's
        env.update(
            CALDERA_JOB_ID=req.job_id,
            CALDERA_ATTEMPT=str(req.attempt),
            CALDERA_PREEMPT_NOTICE=str(_notice(scratch)),
            CUDA_DEVICE_ORDER="PCI_BUS_ID",
        )  # CUDA numbers GPUs like NVML, so indices mean the same GPU
        return env

    @staticmethod
    def _rank_env(req: LaunchRequest, rank: int, replica: int) -> dict[str, str]:
        alloc = req.allocations[replica] if replica < len(req.allocations) else None
        return {
            "CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in alloc.gpus) if alloc else "",
            procs.TAG_VAR: f"{req.job_id}/{req.attempt}/{rank}",
        }

    @staticmethod
    def _spawn(rd: RunDir, rank: int, prefix: list[str], launch: Launch) -> subprocess.Popen[bytes]:
        """Start rank ``rank``'s supervisor: root, so nothing of the user's reaches it but the launch file (data)."""
        launchfile.write(rd, rank, launch)
        with open(rd.log(rank), "ab") as log:
            # own session: the shim leads a process group with everything the command starts, and a signal to
            # the server (or its death) does not reach it
            return subprocess.Popen(
                [*prefix, sys.executable, "-I", "-c", _SHIM_MAIN, "--run-dir", str(rd.path), "--rank", str(rank)],
                cwd="/",
                env=launchfile.root_env(launch.tag),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )

    @staticmethod
    def _await_started(rd: RunDir, started: list[tuple[int, subprocess.Popen[bytes], int | None]], exe: str) -> None:
        """Every shim started its command (or that command already ended): all ranks exist, or none will."""
        pending = {r: p for r, p, _ in started}
        deadline = time.monotonic() + _START_TIMEOUT_S
        while pending:
            for r, p in list(pending.items()):
                # asked first: a shim writes its files before it exits, so one that had exited by now and left
                # neither file never started the command (asked last, a fast command could finish in between)
                exited = p.poll() is not None
                ex = read_json(rd.exitfile(r))
                if ex is not None:
                    if ex.get("exec_errno") == errno.ENOENT:  # looked up by the job itself, as its owner
                        raise LaunchError("CommandNotFound", f"command not found: {exe}")
                    if "spawn_error" in ex:
                        raise LaunchError("SpawnFailed", f"rank {r}: cannot start {exe}: {ex['spawn_error']}")
                    del pending[r]
                elif (read_json(rd.pidfile(r)) or {}).get("child_pid"):
                    del pending[r]
                elif exited:
                    tail = rd.log(r).read_bytes()[-500:].decode(errors="replace").strip()
                    raise LaunchError(
                        "SupervisorFailed",
                        f"rank {r}: supervisor exited with {p.returncode} before starting the command: {tail}",
                    )
            if pending and time.monotonic() > deadline:
                raise LaunchError(
                    "StartTimeout", f"ranks {sorted(pending)} did not start within {_START_TIMEOUT_S:.0f}s"
                )
            if pending:
                time.sleep(0.02)

    def _abort(
        self, rd: RunDir, req: LaunchRequest, started: list[tuple[int, subprocess.Popen[bytes], int | None]]
    ) -> None:
        for _, p, _ in started:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # not reaped yet, so the pid (= pgid) is still ours
            except ProcessLookupError:
                pass
        procs.kill_all(procs.job_processes(set(), tag_prefix=f"{req.job_id}/{req.attempt}/"))
        for _, p, _ in started:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        try:
            rd.path.rename(rd.path.with_name(f"{rd.path.name}.failed-{time.time_ns()}"))
        except OSError:
            pass

    # -- re-attach -------------------------------------------------------------------------------------------
    def _get_meta(self, handle: Handle) -> dict[str, Any] | None:
        key = (handle.job_id, handle.attempt)
        meta = self._meta.get(key)
        if meta is not None:
            return meta
        if handle.data.get("ranks") and handle.data.get("run_dir"):
            meta = dict(handle.data)
        else:
            meta = read_json(self._run_dir_path(handle.job_id, handle.attempt) / "meta.json")
            if meta is None:
                return None
        with self._lock:
            self._meta[key] = meta
        return meta

    def _rank_exit(self, key: _Key, rd: RunDir, rank: int) -> dict[str, Any] | None:
        known = self._exits.get(key, {})
        rec = known.get(rank)
        if rec is None:
            rec = read_json(rd.exitfile(rank))
            if rec is not None:
                self._exits.setdefault(key, {})[rank] = rec
        return rec

    def _reap(self, key: _Key) -> None:
        kids = self._children.get(key)
        if kids:
            self._children[key] = [p for p in kids if p.poll() is None]

    # -- observe ---------------------------------------------------------------------------------------------
    def observe(self, handle: Handle) -> Observation:
        key = (handle.job_id, handle.attempt)
        final = self._final.get(key)
        if final is not None:
            return final
        meta = self._get_meta(handle)
        if meta is None:
            if key not in self._launching:
                self._kill_interrupted_launch(key)
            return Observation(Phase.LOST, reason="NotFound", message="this attempt was never launched completely")
        self._reap(key)
        rd = RunDir(meta["run_dir"])
        exits: dict[int, dict[str, Any]] = {}
        running: list[int] = []
        gone: list[int] = []
        for rk in meta["ranks"]:
            r = rk["rank"]
            rec = self._rank_exit(key, rd, r)
            if rec is None and procs.is_alive(rk["pid"], rk["start"]):
                running.append(r)
                continue
            if rec is None:  # the shim writes its record just before it exits: look once more
                rec = self._rank_exit(key, rd, r)
            if rec is not None:
                exits[r] = rec
            elif rd.stop.exists():
                # our SIGKILL backstop hit the shim too: a stop, not a lost job
                exits[r] = {"exit_code": 137, "signal": "SIGKILL", "ended_at": time.time(), "reason": "Killed"}
            else:
                gone.append(r)

        if gone:
            self._kill_job(meta, key)  # the rest of a job we lost track of must not hold its GPUs
            who = f"rank {gone[0]}'s" if meta["world_size"] > 1 else "the"
            return self._finish(
                key,
                Observation(
                    Phase.LOST,
                    reason="ProcessGone",
                    message=f"{who} supervisor disappeared without recording an exit status",
                ),
            )

        if running:
            failure = read_json(rd.gang_failure)
            msg = f"rank {failure['rank']} failed; stopping the other ranks" if failure else ""
            if JobKind(meta["kind"]).interactive and not self._logins.login(key, meta, rd, self._token(key, rd)):
                return Observation(Phase.STARTING, message=f"waiting for {session_servers.of(meta).name} to answer")
            return Observation(Phase.RUNNING, message=msg)

        return self._finish(key, self._outcome(meta, rd, exits))

    def _kill_interrupted_launch(self, key: _Key) -> None:
        """The server died inside launch(): a run dir without meta.json, maybe with ranks running. The server
        never got a handle for them, so nobody else would ever stop them."""
        if self._run_dir_path(*key).is_dir():
            procs.kill_all(procs.job_processes(set(), tag_prefix=f"{key[0]}/{key[1]}/"))

    def _outcome(self, meta: dict[str, Any], rd: RunDir, exits: dict[int, dict[str, Any]]) -> Observation:
        failed = {r: rec for r, rec in exits.items() if rec["exit_code"] != 0}
        if not failed:
            return Observation(Phase.SUCCEEDED, exit_code=0, reason="ExitCode", message="exited with code 0")
        gang = read_json(rd.gang_failure)
        if gang and gang.get("rank") in failed:
            r = gang["rank"]
        else:
            r = min(failed, key=lambda k: (failed[k].get("ended_at", 0), k))
        rec = failed[r]
        msg = _exit_message(rec)
        if meta["world_size"] > 1:
            msg = f"rank {r} {msg}"
        reason = "ExitCode"
        if rd.stop.exists():
            reason, msg = "Stopped", msg + " after a stop request"
        return Observation(Phase.FAILED, exit_code=rec["exit_code"], reason=reason, message=msg)

    def _finish(self, key: _Key, obs: Observation) -> Observation:
        with self._lock:
            self._forget(key)  # a long-running server must not accumulate every job it ever ran
            self._final[key] = obs
            while len(self._final) > _MAX_FINAL:  # oldest first; a dropped one is re-read from its run dir
                del self._final[next(iter(self._final))]
            self._children.pop(key, None)
        return obs

    def _token(self, key: _Key, rd: RunDir) -> str | None:
        tok = self._tokens.get(key)
        if tok is None:
            try:
                tok = self._tokens[key] = rd.token.read_text().strip()
            except OSError:
                return None
        return tok

    # -- stop ------------------------------------------------------------------------------------------------
    def stop(self, handle: Handle, grace_s: float, notice: str | None = None) -> None:
        """SIGTERM now, SIGKILL at now + ``grace_s``; returns at once.

        The SIGKILL is done by each rank's shim (it reads the deadline from stop.json when SIGTERM arrives), so it
        still happens if the server dies meanwhile; a daemon thread here is the backstop for a wedged shim.
        """
        meta = self._get_meta(handle)
        if meta is None:
            return
        key = (handle.job_id, handle.attempt)
        rd = RunDir(meta["run_dir"])
        tag_prefix = f"{handle.job_id}/{handle.attempt}/"
        pending = [rk for rk in meta["ranks"] if self._rank_exit(key, rd, rk["rank"]) is None]
        if not pending:
            return  # it ended by itself; a stop record now would rewrite how it ended
        live = [rk for rk in pending if procs.is_alive(rk["pid"], rk["start"])]
        if not live:  # a lost job: no supervisor is left to ask, only strays to kill
            procs.kill_all(procs.job_processes(set(), tag_prefix=tag_prefix))
            return
        kill_at = record_stop(rd, Path(meta["scratch"]), _run_as(meta), grace_s, notice)
        for rk in live:
            # the shim forwards SIGTERM to its whole group once: signalling the group ourselves would hand the
            # command a second SIGTERM through the shim
            procs.signal_verified(rk["pid"], rk["start"], signal.SIGTERM)
        threading.Thread(
            target=self._backstop, args=(meta, key, kill_at), daemon=True, name=f"caldera-kill-{handle.job_id}"
        ).start()

    def _backstop(self, meta: dict[str, Any], key: _Key, kill_at: float) -> None:
        time.sleep(max(0.0, kill_at + _KILL_MARGIN_S - time.time()))
        rd = RunDir(meta["run_dir"])
        if all(self._rank_exit(key, rd, rk["rank"]) is not None for rk in meta["ranks"]):
            return
        self._kill_job(meta, key)

    def _kill_job(self, meta: dict[str, Any], key: _Key) -> None:
        """SIGKILL everything of the job: the groups of live shims, and whatever carries the job's run tag."""
        groups = {rk["pid"] for rk in meta["ranks"] if procs.is_alive(rk["pid"], rk["start"])}
        for pg in groups:
            try:
                os.killpg(pg, signal.SIGKILL)
            except ProcessLookupError:
                pass
        procs.kill_all(procs.job_processes(groups, tag_prefix=f"{key[0]}/{key[1]}/"))
        self._reap(key)

    def end_attempt(self, job_id: str, attempt: int) -> bool:
        """For an attempt whose record cannot be read: SIGKILL every process that carries its run tag (each rank's
        command and all it started). True once none is left, so the platform may call the attempt Lost."""
        tag = f"{job_id}/{attempt}/"
        for _ in range(50):
            left = procs.job_processes(set(), tag_prefix=tag)
            if not left:
                return True
            procs.kill_all(left)
            time.sleep(0.1)
        return False

    def usage(self, handle: Handle) -> ProcessUsage | None:
        """CPU time and resident memory of the job's live processes (the platform's solo profiles): its ranks'
        process groups and whatever carries its run tag. Reads every /proc entry, so callers sample it sparingly."""
        meta = self._get_meta(handle)
        if meta is None:
            return None
        groups = {rk["pid"] for rk in meta["ranks"] if procs.is_alive(rk["pid"], rk["start"])}
        if not groups:
            return None
        pids = procs.job_processes(groups, tag_prefix=f"{handle.job_id}/{handle.attempt}/")
        cpu_s, rss_mib = procs.cpu_and_rss(pids)
        return ProcessUsage(cpu_s, rss_mib)

    # -- logs ------------------------------------------------------------------------------------------------
    def logs(self, handle: Handle, rank: int | None = None, follow: bool = False, offset: int = 0) -> Iterator[bytes]:
        meta = self._get_meta(handle)
        if meta is None:
            return iter(())
        r = 0 if rank is None else rank
        if not 0 <= r < meta["world_size"]:
            raise ValueError(f"rank {r} does not exist (world size {meta['world_size']})")
        return follow_file(RunDir(meta["run_dir"]).log(r), offset, follow, lambda: self._ended(handle, meta))

    def _ended(self, handle: Handle, meta: dict[str, Any]) -> bool:
        key = (handle.job_id, handle.attempt)
        if key in self._final:
            return True
        rd = RunDir(meta["run_dir"])
        return all(
            self._rank_exit(key, rd, rk["rank"]) is not None or not procs.is_alive(rk["pid"], rk["start"])
            for rk in meta["ranks"]
        )

    # -- endpoints -------------------------------------------------------------------------------------------
    def endpoints(self, handle: Handle) -> list[Endpoint]:
        """The Lab (code-server) of a running jupyter (vscode) job, on its Unix socket. The proxy in front of it must
        send the returned Cookie (the server's login) on every request and websocket upgrade and Host ``localhost``;
        see ``local.jupyter``."""
        meta = self._get_meta(handle)
        if meta is None or not JobKind(meta["kind"]).interactive:
            return []
        key = (handle.job_id, handle.attempt)
        rd = RunDir(meta["run_dir"])
        token = self._token(key, rd)
        # the proxy holds no lock: it may wait for the login (one the loop's observe started, or a restarted server's)
        self._logins.login(key, meta, rd, token, wait_s=code_server.LOGIN_TIMEOUT_S)
        if self.observe(handle).phase is not Phase.RUNNING:
            return []
        return self._logins.endpoint(key, meta, rd, token)

    # -- exec ------------------------------------------------------------------------------------------------
    def exec(self, handle: Handle, rank: int, argv: list[str], tty: bool, term: str = "") -> ExecProcess:
        """``argv`` in rank ``rank``: in its PID, mount and network namespaces (those of its init, a child of
        its verified supervisor), as the job's uid (see ``enter``). It dies with the rank's PID namespace."""
        meta = self._get_meta(handle)
        if meta is None or self.observe(handle).phase is not Phase.RUNNING:
            raise ExecError("NotRunning", f"job {handle.job_id} is not running")
        if not 0 <= rank < meta["world_size"]:
            raise ExecError("NoSuchRank", f"rank {rank} does not exist (world size {meta['world_size']})")
        rd = RunDir(meta["run_dir"])
        rec = read_json(rd.pidfile(rank)) or {}
        if not procs.is_alive(rec.get("shim_pid"), rec.get("shim_start")) or rd.exitfile(rank).exists():
            raise ExecError("NotRunning", f"rank {rank} of job {handle.job_id} is not running")
        tag = f"{handle.job_id}/{handle.attempt}/{rank}"
        env = {**meta.get("exec_env", {}), procs.TAG_VAR: tag, "TERM": terminal_name(term) if tty else "dumb"}
        ids = meta.get("run_as")
        request = {
            "argv": argv,
            "env": env,
            "workdir": meta.get("workdir", "/"),
            "uid": ids[0] if ids else None,
            "gid": ids[1] if ids else None,
            "tty": tty,
        }
        init = rec.get("init_pid")
        prefix: list[str] = []
        if meta.get("private", init != rec.get("child_pid")):
            if not init or init not in procs.children(rec["shim_pid"]):
                raise ExecError("NotRunning", f"rank {rank} of job {handle.job_id} is ending")
            nsenter = shutil.which("nsenter") or "nsenter"
            prefix = [nsenter, f"--target={init}", "--mount", "--pid", "--net", "--"]
        return _enter([*prefix, sys.executable, "-I", "-c", _ENTER_MAIN], request, tty, launchfile.root_env(tag))


def _enter(argv: list[str], request: dict[str, Any], tty: bool, env: dict[str, str]) -> ExecProcess:
    """Start the ``enter`` helper and hand it ``request`` on a pipe of its own: the user's command as data."""
    r, w = os.pipe()
    try:
        proc = spawn([*argv, str(r)], env, tty, pass_fds=(r,))
    finally:
        os.close(r)
    try:
        with os.fdopen(w, "w") as f:
            json.dump(request, f)
    except OSError as exc:  # the helper ended before it read its request
        proc.kill()
        raise ExecError("StartFailed", f"cannot start the command: {exc}") from exc
    return proc


def _notice(scratch: Path) -> Path:
    return scratch / NOTICE_FILE


def _run_as(meta: dict[str, Any]) -> RunAs | None:
    ids = meta.get("run_as")
    return RunAs("", ids[0], ids[1]) if ids else None
