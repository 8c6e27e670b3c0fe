"""The container runtime: one rootful podman container per rank.

Each rank runs as its owner's uid:gid with every capability dropped, ``no-new-privileges``, podman's init as PID 1
(so SIGTERM reaches the command as it does outside a container), cgroup limits from its allocation (cpus, memory)
and a pids limit, no network but loopback (the ranks of a distributed job share rank 0's network namespace), its
GPUs as devices, and two host directories mounted at their own paths: the owner's workspace and the attempt's
scratch directory (preemption notice, the lab's socket); a shareable job also gets the CUDA MPS pipe directory,
read-only, where an MPS daemon runs. Nothing else of the host is visible.

Containers carry their job id, attempt and rank as labels and names (``caldera-<job>-<attempt>-<rank>``), and
conmon keeps them and their logs going without a server, so any instance of this runtime re-attaches by asking
podman. The run directory (settings.runs_dir/<job>/<attempt>, root 0700) holds what the job must not see:

    meta.json        what was launched (``Handle.data`` is the same)
    rank-<r>.log     the rank's output as conmon writes it (see ``logs``)
    rank-<r>.env     the rank's environment, handed to podman as a file so no process listing shows it
    rank-<r>.env.d/  the values that file cannot hold, and the launcher that applies them in the container
                     (see ``envfile``: no job value ever reaches podman's own environment or options)
    stop.json        a stop was requested (its grace and SIGKILL time)
    gang-failure.json, jupyter.token   as in the local runtime
    final.json       how the job ended; written before its containers are removed
"""

from __future__ import annotations

import logging
import math
import os
import re
import secrets
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from caldera.config import Settings
from caldera.core.cluster import Device, Node
from caldera.core.spec import JobKind
from caldera.runtime import gpu_share
from caldera.runtime.base import Endpoint, ExecError, Handle, LaunchError, LaunchRequest, Observation, Phase, RunAs
from caldera.runtime.container import devices, envfile, logs
from caldera.runtime.container.image import ImageInfo
from caldera.runtime.container.podman import Podman, PodmanError
from caldera.runtime.container.settings import ContainerSettings
from caldera.runtime.exec_process import ExecProcess, spawn, terminal_name
from caldera.runtime.local import code_server, jupyter, owner, session_servers
from caldera.runtime.local.gpus import discover_gpus, nvml_devices
from caldera.runtime.local.rundir import RunDir, create_json_exclusive, read_json, write_json_atomic, write_text_atomic
from caldera.runtime.local.session_servers import SessionLogins
from caldera.runtime.local.stop_record import NOTICE_FILE, record_stop
from caldera.runtime.mount_points import check_mount_points

log = logging.getLogger(__name__)
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,100}$")  # what podman accepts in a container name
_LABEL = "caldera.job"
_LISTING_TTL_S = 0.5  # a container's end is seen this much later at most; a new one is never missed (see _ranks)
_MASTER_PORT = 29500  # the ranks' own network namespace: no other service can hold it
_STARTING = {"created", "configured", "initialized"}
_ENDED = {"exited", "stopped", "dead"}
_Key = tuple[str, int]


def container_name(job_id: str, attempt: int, rank: int) -> str:
    return f"caldera-{job_id}-{attempt}-{rank}"


def _final_path(rd: RunDir) -> Path:
    return rd.path / "final.json"


class ContainerRuntime:
    name = "container"

    def __init__(self, settings: Settings, container: ContainerSettings | None = None):
        self.settings = settings
        self.cs = container or ContainerSettings()
        conf = str(self.cs.conf) if self.cs.conf else None
        self.podman = Podman(self.cs.global_args(), conf, self.cs.command_timeout_s)
        self._gpus: tuple[Device, ...] | None = None
        self._real_gpus = False
        self._lock = threading.Lock()
        self._launching: set[_Key] = set()
        self._final: dict[_Key, Observation] = {}
        self._meta: dict[_Key, dict[str, Any]] = {}
        self._logins = SessionLogins()
        self._images: dict[str, ImageInfo] = {}
        self._listing: tuple[dict[_Key, dict[str | None, dict[str, Any]]], float] = ({}, 0.0)

    # -- nodes -----------------------------------------------------------------------------------------------
    def nodes(self) -> list[Node]:
        if self._gpus is None:
            real = nvml_devices()
            self._real_gpus = bool(real)
            self._gpus = real or discover_gpus(self.settings)
        s = self.settings
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)
        return [
            Node(
                name=s.node_name or socket.gethostname(),
                cpu=float(s.node_cpu or os.cpu_count() or 1),
                memory_mib=int(s.node_memory_mib or memory),
                gpus=self._gpus,
            )
        ]

    # -- launch ----------------------------------------------------------------------------------------------
    def launch(self, req: LaunchRequest) -> Handle:
        if not _ID.match(req.job_id):
            raise LaunchError("BadJobId", f"job id {req.job_id!r} cannot name a container")
        key = (req.job_id, req.attempt)
        with self._lock:
            if key in self._launching:
                raise LaunchError("AlreadyLaunching", f"attempt {req.attempt} of job {req.job_id} is being launched")
            self._launching.add(key)
            self._final.pop(key, None)
            self._meta.pop(key, None)
            self._logins.forget(key)
        try:
            return self._launch(req)
        finally:
            with self._lock:
                self._launching.discard(key)

    def _pull(self, image: str) -> ImageInfo | None:
        """An image of the platform's registry that is not on this host yet, pulled with the platform's login (a
        private authfile): the job's container never holds the login. None when it is not there either."""
        from caldera.images import registry

        if not image.startswith(registry.host(self.settings) + "/"):
            return None
        tls = "false" if registry.insecure(self.settings) else "true"
        authfile = registry.authfile(self.settings)
        creds = [f"--authfile={authfile}"] if authfile else []
        try:
            self.podman.run("pull", "--quiet", f"--tls-verify={tls}", *creds, image)
        except PodmanError:
            return None
        return ImageInfo.load(self.podman, image)

    def _launch(self, req: LaunchRequest) -> Handle:
        self._check_mount_points(req)
        image = req.spec.image or self.cs.image
        try:
            info = ImageInfo.load(self.podman, image) or self._pull(image)
            if info is None:
                hint = " (caldera images bootstrap makes the base image)" if image == self.cs.image else ""
                raise LaunchError("ImageNotFound", f"image {image} is not on this host{hint}")
            self._clear_leftovers(req)
        except (PodmanError, OSError, subprocess.SubprocessError) as exc:
            raise LaunchError("RuntimeUnavailable", f"podman is not usable: {exc}") from None
        info = self._images.setdefault(info.id, info)  # what was looked up in it stays known
        rd = self._prepare_run_dir(req)
        names: list[str] = []
        try:
            data = self._start(req, rd, info, names)
        except Exception as exc:
            self._remove(names)
            rd.path.rename(rd.path.with_name(f"{rd.path.name}.failed-{time.time_ns()}"))
            if isinstance(exc, LaunchError):
                raise
            raise LaunchError("StartFailed", f"cannot start job: {exc}") from exc
        write_json_atomic(rd.meta, data)
        with self._lock:
            self._meta[(req.job_id, req.attempt)] = data
            self._listing = ({}, 0.0)  # it may show containers this launch replaced
        return Handle(req.job_id, req.attempt, dict(data))

    def _labels(self, job_id: str, attempt: int) -> tuple[str, str]:
        return f"{_LABEL}={job_id}", f"caldera.attempt={attempt}"

    def _clear_leftovers(self, req: LaunchRequest) -> None:
        """Containers of this very attempt: running ones refuse the launch; those of a launch a crash interrupted
        are removed."""
        old = self.podman.containers(*self._labels(req.job_id, req.attempt))
        if any(c.get("State") not in _ENDED for c in old):
            raise LaunchError("AlreadyRunning", f"attempt {req.attempt} of job {req.job_id} is already running")
        self._remove([c["Names"][0] for c in old])

    def _prepare_run_dir(self, req: LaunchRequest) -> RunDir:
        path = self._run_dir_path(req.job_id, req.attempt)
        if path.exists():
            path.rename(path.with_name(f"{path.name}.stale-{time.time_ns()}"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir(mode=0o700)
        return RunDir(path)

    def _run_dir_path(self, job_id: str, attempt: int) -> Path:
        return Path(self.settings.runs_dir).resolve() / job_id / str(attempt)

    def _start(self, req: LaunchRequest, rd: RunDir, info: ImageInfo, names: list[str]) -> dict[str, Any]:
        spec, image = req.spec, info.id
        mounts, workdir = self._host_dirs(req)
        scratch = owner.owned_dir(self._scratch_parent() / f"{req.job_id}.{req.attempt}", req.run_as, fresh=True)
        world = spec.world_size if spec.kind is JobKind.DISTRIBUTED else 1
        data: dict[str, Any] = {
            "run_dir": str(rd.path),
            "kind": spec.kind.value,
            "world_size": world,
            "names": [container_name(req.job_id, req.attempt, r) for r in range(world)],
            "scratch": str(scratch),
            "run_as": [req.run_as.uid, req.run_as.gid] if req.run_as else None,
            "image": info.image,
            "image_id": info.id,
            "memory_mib": self._memory_mib(req.allocations[0] if req.allocations else None, spec.procs_per_replica),
        }
        env = self._base_env(req, scratch, info)
        env.update(owner.authorized_keys(scratch, req.authorized_keys, req.run_as))  # scratch is mounted as is
        mps_args = self._mps(spec, env)
        if spec.kind is JobKind.JUPYTER:
            argv = self._jupyter(req, rd, scratch, workdir, env, data)
        elif spec.kind is JobKind.VSCODE:  # the image's code-server; its terminals' shell: the image's bash, else sh
            shell = "/bin/sh" if info.missing("/bin/bash") else "/bin/bash"
            argv, sock = code_server.prepare("code-server", req, rd, scratch, workdir, env, shell)
            data.update(socket=str(sock), base_url="/")
        else:
            argv = list(spec.command or [])
        self._check_command(info, argv, mounts, spec.kind)
        if self._gpus is None:
            self.nodes()
        for r in range(world):
            replica = r // spec.procs_per_replica
            alloc = req.allocations[replica] if replica < len(req.allocations) else None
            gpu_args, visible = devices.device_args(alloc.gpus if alloc else (), self._real_gpus)
            rank_env = {**env, "CUDA_VISIBLE_DEVICES": visible}
            network = self.cs.network
            if spec.kind is JobKind.DISTRIBUTED:
                rank_env.update(self._rank_env(spec, r, world))
                network = self.cs.network if r == 0 else f"container:{data['names'][0]}"
            env_args, launcher = envfile.write(rd, r, rank_env)
            if launcher and info.missing(envfile.SHELL):
                why = f"environment values with a line break or over 60 KB need {envfile.SHELL} in the image"
                raise LaunchError("ShellNotInImage", why)
            args = [
                "run",
                "--detach",
                "--name",
                data["names"][r],
                *(a for lab in (*self._labels(req.job_id, req.attempt), f"caldera.rank={r}") for a in ("--label", lab)),
                "--init",
                "--cap-drop=all",
                "--security-opt=no-new-privileges",
                "--user",
                f"{req.run_as.uid}:{req.run_as.gid}" if req.run_as else "0:0",
                f"--network={network}",
                f"--pids-limit={self.cs.pids_limit}",
                *self._limits(alloc, spec.procs_per_replica),
                *gpu_args,
                "--log-driver=k8s-file",
                f"--log-opt=path={rd.log(r)}",
                *(a for m in mounts for a in ("--volume", f"{m}:{m}:rw")),
                "--volume",
                f"{scratch}:{scratch}:rw",
                *(a for host, at, rw in req.mounts for a in ("--volume", f"{host}:{at}:{'rw' if rw else 'ro'}")),
                *mps_args,
                f"--workdir={workdir}",  # bound to its option: a path of the user's choosing
                *env_args,
                image,
                *launcher,
                *argv,
            ]
            names.append(data["names"][r])  # before it exists: a failure half-way must remove it too
            self.podman.run(*args)
        return data

    def _check_mount_points(self, req: LaunchRequest) -> None:
        """Each space's mount point lies in the allowlist (core.spec.MOUNT_TOPS, checked here again: the runtime is
        the boundary) and neither covers nor lies in another mount: the platform's (the workspace, the scratch
        directory, the launcher's values, the MPS pipes, each bound at a host path podman would make a mount
        point in, as root, inside the space) or another space's."""
        pipe = gpu_share.mps_pipe_dir() if req.spec.shareable else None
        platform = [req.home or req.workdir, self.settings.scratch_dir, envfile.MOUNT, *([pipe] if pipe else [])]
        check_mount_points(req.mounts, platform)

    def _host_dirs(self, req: LaunchRequest) -> tuple[list[Path], Path]:
        """The one host directory the job gets (its owner's space, or its working directory when it has no
        owner), and its working directory, made as the job's uid so nothing it planted is followed as root."""
        workdir = Path(os.path.normpath(req.workdir))
        if req.home is None:
            workdir.mkdir(parents=True, exist_ok=True)
            return [workdir.resolve()], workdir.resolve()
        home = Path(os.path.normpath(req.home))
        if workdir != home and home not in workdir.parents:
            raise LaunchError("BadWorkdir", f"working directory {workdir} is outside the owner's space {home}")
        owner.platform_dir(home.parent, 0o711)
        owner.owned_dir(home, req.run_as)
        _mkdir_as(workdir, req.run_as)
        return [home], workdir

    def _scratch_parent(self) -> Path:
        owner.platform_dir(self.settings.data_dir, 0o711)
        owner.platform_dir(self.settings.scratch_dir, 0o711)
        return self.settings.scratch_dir

    def _check_command(self, info: ImageInfo, argv: list[str], mounts: list[Path], kind: JobKind) -> None:
        if not argv:
            raise LaunchError("NoCommand", "no command")
        exe = argv[0]
        in_host_dir = (not exe.startswith("/") and "/" in exe) or any(m in Path(exe).parents for m in mounts)
        if in_host_dir:
            return  # a program in the workspace: the job reports it if it is not there
        why = info.missing(exe, jupyter=kind is JobKind.JUPYTER)
        if why and kind is JobKind.VSCODE:
            raise LaunchError("CodeServerMissing", f"image {info.image} has no code-server on its PATH")
        if why:
            raise LaunchError(*why)

    def _base_env(self, req: LaunchRequest, scratch: Path, info: ImageInfo) -> dict[str, str]:
        env = {"PATH": info.path, "PYTHONUNBUFFERED": "1", "HOME": str(req.home or req.workdir)}
        if req.run_as is not None:
            env.update(USER=req.run_as.name, LOGNAME=req.run_as.name)
        env.update(req.spec.env)
        env.update(req.env)
        env.update(
            CALDERA_JOB_ID=req.job_id,
            CALDERA_ATTEMPT=str(req.attempt),
            CALDERA_PREEMPT_NOTICE=str(scratch / NOTICE_FILE),
            CUDA_DEVICE_ORDER="PCI_BUS_ID",
        )
        return env

    @staticmethod
    def _mps(spec: Any, env: dict[str, str]) -> list[str]:
        """A shareable job on a host with an MPS control daemon gets its pipe directory, read-only (clients only
        connect to the pipes and sockets there), and ``CUDA_MPS_PIPE_DIRECTORY`` naming it, so the MPS server
        enforces its GPU-memory limit as for the process runtime (caldera/runtime/gpu_share.py)."""
        pipe = gpu_share.mps_pipe_dir() if spec.shareable else None
        if pipe is None:
            return []
        env["CUDA_MPS_PIPE_DIRECTORY"] = str(pipe)
        return ["--volume", f"{pipe}:{pipe}:ro"]

    @staticmethod
    def _rank_env(spec: Any, rank: int, world: int) -> dict[str, str]:
        replica = rank // spec.procs_per_replica
        env = {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(_MASTER_PORT),
            "WORLD_SIZE": str(world),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank % spec.procs_per_replica),
            "NODE_RANK": str(replica),
            "GROUP_RANK": str(replica),
            "LOCAL_WORLD_SIZE": str(spec.procs_per_replica),
        }
        for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):  # only lo exists in there
            if var not in spec.env:
                env[var] = "lo"
        return env

    @staticmethod
    def _memory_mib(alloc: Any, procs: int) -> int | None:
        if alloc is None or alloc.memory_mib <= 0:
            return None
        return max(6, alloc.memory_mib // procs)  # podman's floor is 6 MiB

    def _limits(self, alloc: Any, procs: int) -> list[str]:
        out = []
        if alloc is not None and alloc.cpu > 0:
            out.append(f"--cpus={alloc.cpu / procs:g}")
        mib = self._memory_mib(alloc, procs)
        if mib:
            out += [f"--memory={mib}m", f"--memory-swap={mib}m"]  # no swap beyond the limit
        return out

    def _jupyter(
        self, req: LaunchRequest, rd: RunDir, scratch: Path, workdir: Path, env: dict[str, str], data: dict[str, Any]
    ) -> list[str]:
        """Lab on a Unix socket in the scratch directory, which the platform's proxy reaches from the host; its
        token through a file deleted once Lab read it, as in the local runtime (see local.jupyter)."""
        base_url = jupyter.normalise_base_url(req.base_url or "/")
        token = secrets.token_hex(24)
        write_text_atomic(rd.token, token, mode=0o600)
        owner.write_owned(scratch / "lab-token", token, req.run_as)
        runtime_dir = owner.owned_dir(scratch / "runtime", req.run_as)
        env.pop("JUPYTER_TOKEN", None)
        env.update(JUPYTER_TOKEN_FILE=str(scratch / "lab-token"), JUPYTER_RUNTIME_DIR=str(runtime_dir))
        sock = scratch / "lab.sock"
        data.update(socket=str(sock), base_url=base_url)
        return ["python3", *jupyter.lab_argv(sock, base_url, workdir, as_root=req.run_as is None)[1:]]

    def end_attempt(self, job_id: str, attempt: int) -> bool:
        """For an attempt whose record cannot be read: remove every container labelled with it. True once podman
        lists none, so the platform may call the attempt Lost."""
        labels = self._labels(job_id, attempt)
        try:
            self._remove([c["Names"][0] for c in self.podman.containers(*labels)])
            return not self.podman.containers(*labels)
        except PodmanError as exc:
            log.warning("cannot end attempt %s of %s: %s", attempt, job_id, exc)
            return False

    def _remove(self, names: list[str]) -> None:
        for attempt in range(2):  # podman may still be cleaning up a container that just exited
            try:
                if names:
                    self.podman.run("rm", "--force", "--ignore", *names)
                return
            except PodmanError as exc:
                if attempt:
                    log.warning("cannot remove containers %s: %s", names, exc)
                time.sleep(0.5)

    # -- observe ---------------------------------------------------------------------------------------------
    def _get_meta(self, handle: Handle) -> dict[str, Any] | None:
        key = (handle.job_id, handle.attempt)
        meta = self._meta.get(key)
        if meta is None:
            if handle.data.get("names") and handle.data.get("run_dir"):
                meta = dict(handle.data)
            else:
                meta = read_json(self._run_dir_path(handle.job_id, handle.attempt) / "meta.json")
            if meta is not None:
                with self._lock:
                    self._meta[key] = meta
        return meta

    def observe(self, handle: Handle) -> Observation:
        key = (handle.job_id, handle.attempt)
        if key in self._final:
            return self._final[key]
        meta = self._get_meta(handle)
        if meta is None:
            if key not in self._launching:
                self._remove([c["Names"][0] for c in self.podman.containers(*self._labels(*key))])
            return Observation(Phase.LOST, reason="NotFound", message="this attempt was never launched completely")
        rd = RunDir(meta["run_dir"])
        final = read_json(_final_path(rd))
        if final is not None:
            fields = {k: v for k, v in final.items() if k != "phase"}
            return self._remember(key, Observation(Phase(final["phase"]), **fields))
        ranks = self._ranks(key, meta["world_size"], fresh=False)
        if any(c is None for c in ranks):
            ranks = self._ranks(key, meta["world_size"], fresh=True)  # not gone because a listing was old
        if any(c is None for c in ranks):
            gone = next(r for r, c in enumerate(ranks) if c is None)
            self._remove(meta["names"])
            who = f"rank {gone}'s" if meta["world_size"] > 1 else "the job's"
            return self._finish(
                key, rd, Observation(Phase.LOST, reason="ContainerGone", message=f"{who} container disappeared")
            )
        running = [r for r, c in enumerate(ranks) if c["State"] not in _ENDED]
        exits = {r: int(c["ExitCode"]) for r, c in enumerate(ranks) if c["State"] in _ENDED}
        if running:
            failed = [r for r, code in exits.items() if code != 0]
            if failed:
                self._gang_stop(meta, rd, failed[0], running)
                return Observation(Phase.RUNNING, message=f"rank {failed[0]} failed; stopping the other ranks")
            if any(ranks[r]["State"] in _STARTING for r in running):
                return Observation(Phase.STARTING, message="containers are being created")
            if JobKind(meta["kind"]).interactive and not self._logins.login(key, meta, rd, _secret(rd)):
                return Observation(Phase.STARTING, message=f"waiting for {session_servers.of(meta).name} to answer")
            return Observation(Phase.RUNNING)
        return self._finish(key, rd, self._outcome(meta, rd, exits))

    def _ranks(self, key: _Key, world: int, fresh: bool) -> list[dict[str, Any] | None]:
        """Each rank's container (podman's ``ps`` record), or None for a rank that has none. One listing of every
        caldera container serves all the jobs a scheduling cycle observes, for up to ``_LISTING_TTL_S``."""
        with self._lock:
            listing, at = self._listing
        if fresh or time.monotonic() - at > _LISTING_TTL_S:
            at = time.monotonic()
            listing = {}
            for c in self.podman.containers(_LABEL):
                lab = c.get("Labels") or {}
                job = (lab.get(_LABEL), int(lab.get("caldera.attempt", 0)))
                listing.setdefault(job, {})[lab.get("caldera.rank")] = c
            with self._lock:
                self._listing = (listing, at)
        mine = listing.get(key, {})
        return [mine.get(str(r)) for r in range(world)]

    def _gang_stop(self, meta: dict[str, Any], rd: RunDir, rank: int, running: list[int]) -> None:
        grace = self.settings.cancel_grace_s
        if create_json_exclusive(rd.gang_failure, {"rank": rank, "at": time.time(), "kill_at": time.time() + grace}):
            self.podman.detached("stop", f"--time={math.ceil(grace)}", *(meta["names"][r] for r in running))

    def _outcome(self, meta: dict[str, Any], rd: RunDir, exits: dict[int, int]) -> Observation:
        failed = {r: code for r, code in exits.items() if code != 0}
        if not failed:
            return Observation(Phase.SUCCEEDED, exit_code=0, reason="ExitCode", message="exited with code 0")
        gang = read_json(rd.gang_failure)
        r = gang["rank"] if gang and gang.get("rank") in failed else min(failed)
        code = failed[r]
        msg = f"exited with code {code}"
        reason = "ExitCode"
        if rd.stop.exists():
            reason, msg = "Stopped", msg + " after a stop request"
        elif code == 137 and self._oom_killed(meta["names"][r]):
            reason, msg = "OutOfMemory", msg + ": killed at its memory limit"
        elif code == 137 and meta.get("memory_mib"):
            # podman cannot tell an OOM kill on every host (not on hybrid cgroups v1), and nothing else of ours
            # SIGKILLs a job that was not being stopped
            reason, msg = (
                "Killed",
                msg + f" (SIGKILL): most likely out of memory, its limit is {meta['memory_mib']} MiB",
            )
        if meta["world_size"] > 1:
            msg = f"rank {r} {msg}"
        return Observation(Phase.FAILED, exit_code=code, reason=reason, message=msg)

    def _oom_killed(self, name: str) -> bool:
        try:
            return self.podman.run("inspect", "--format", "{{.State.OOMKilled}}", name).strip() == "true"
        except PodmanError:
            return False

    def _finish(self, key: _Key, rd: RunDir, obs: Observation) -> Observation:
        """Records how the job ended, then removes its containers (their logs stay in the run directory)."""
        write_json_atomic(_final_path(rd), {**asdict(obs), "phase": obs.phase.value})
        meta = self._meta.get(key)
        if meta:
            self._remove(meta["names"])
        return self._remember(key, obs)

    def _remember(self, key: _Key, obs: Observation) -> Observation:
        with self._lock:
            self._final[key] = obs
            self._meta.pop(key, None)
            self._logins.forget(key)
        return obs

    # -- stop ------------------------------------------------------------------------------------------------
    def stop(self, handle: Handle, grace_s: float, notice: str | None = None) -> None:
        """SIGTERM now, SIGKILL after ``grace_s``, by a detached ``podman stop`` that outlives the server."""
        meta = self._get_meta(handle)
        key = (handle.job_id, handle.attempt)
        if meta is None or key in self._final:
            return
        rd = RunDir(meta["run_dir"])
        live = [c["Names"][0] for c in self.podman.containers(*self._labels(*key)) if c["State"] not in _ENDED]
        if not live:
            return
        ids = meta.get("run_as")
        run_as = RunAs("", ids[0], ids[1]) if ids else None
        kill_at = record_stop(rd, Path(meta["scratch"]), run_as, grace_s, notice)
        self.podman.detached("stop", f"--time={math.ceil(max(0.0, kill_at - time.time()))}", *live)

    # -- logs ------------------------------------------------------------------------------------------------
    def logs(self, handle: Handle, rank: int | None = None, follow: bool = False, offset: int = 0) -> Iterator[bytes]:
        meta = self._get_meta(handle)
        if meta is None:
            return iter(())
        r = 0 if rank is None else rank
        if not 0 <= r < meta["world_size"]:
            raise ValueError(f"rank {r} does not exist (world size {meta['world_size']})")
        ended = lambda: self.observe(handle).phase in (Phase.SUCCEEDED, Phase.FAILED, Phase.LOST)
        return logs.read(RunDir(meta["run_dir"]).log(r), offset, follow, ended)

    # -- endpoints -------------------------------------------------------------------------------------------
    def endpoints(self, handle: Handle) -> list[Endpoint]:
        """The Lab (code-server) of a running jupyter (vscode) job on its Unix socket, as the local runtime gives it."""
        meta = self._get_meta(handle)
        if meta is None or not JobKind(meta["kind"]).interactive:
            return []
        key = (handle.job_id, handle.attempt)
        rd = RunDir(meta["run_dir"])
        secret = _secret(rd)
        self._logins.login(key, meta, rd, secret, wait_s=code_server.LOGIN_TIMEOUT_S)  # the proxy holds no lock
        if self.observe(handle).phase is not Phase.RUNNING:
            return []
        return self._logins.endpoint(key, meta, rd, secret)

    # -- exec ------------------------------------------------------------------------------------------------
    def exec(self, handle: Handle, rank: int, argv: list[str], tty: bool, term: str = "") -> ExecProcess:
        """``podman exec`` into the rank's container as the job's uid (the container's dropped capabilities and
        no-new-privileges hold for it too); the user's words come after ``--`` and the container's name."""
        meta = self._get_meta(handle)
        if meta is None or self.observe(handle).phase is not Phase.RUNNING:
            raise ExecError("NotRunning", f"job {handle.job_id} is not running")
        if not 0 <= rank < meta["world_size"]:
            raise ExecError("NoSuchRank", f"rank {rank} does not exist (world size {meta['world_size']})")
        ids = meta.get("run_as")
        terminal = ["--tty", f"--env=TERM={terminal_name(term)}"] if tty else []
        args = [
            *self.podman.base,
            "exec",
            "--interactive",
            *terminal,
            "--detach-keys=",  # every key reaches the command: none detaches
            f"--user={ids[0]}:{ids[1]}" if ids else "--user=0:0",
            "--",
            meta["names"][rank],
            *argv,
        ]
        return spawn(args, self.podman.env, tty, cwd=str(self.podman.cwd))


def _mkdir_as(path: Path, run_as: RunAs | None) -> None:
    """``mkdir -p`` as the job's uid, so a symlink the job planted in its space gives it nothing it had not."""
    if run_as is None:
        path.mkdir(parents=True, exist_ok=True)
        return
    p = subprocess.run(
        ["mkdir", "-p", "--", str(path)],
        user=run_as.uid,
        group=run_as.gid,
        extra_groups=[],
        capture_output=True,
        env={"PATH": "/usr/bin:/bin"},
        timeout=30,
    )
    if p.returncode != 0:
        raise LaunchError("BadWorkdir", f"cannot make {path}: {p.stderr.decode(errors='replace').strip()}")


def _secret(rd: RunDir) -> str | None:
    """The platform's copy of the session server's password (token)."""
    try:
        return rd.token.read_text().strip()
    except OSError:
        return None
