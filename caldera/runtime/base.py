"""The one interface every backend implements (local processes now; containers, Kubernetes+Volcano, Slurm later).

A runtime is told where a job runs (the scheduler's allocations) and makes it so. Everything it needs to find a job
again after the server restarts lives under the job's run directory or in ``Handle.data`` (stored by the server).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Protocol

from caldera.core.cluster import Allocation, Node
from caldera.core.spec import JobSpec
from caldera.runtime.exec_process import ExecProcess


@dataclass(frozen=True)
class RunAs:
    """The unprivileged OS identity a job's processes run as (its owner's)."""

    name: str
    uid: int
    gid: int


@dataclass(frozen=True)
class LaunchRequest:
    job_id: str
    attempt: int  # 1 for the first run, +1 after each preemption re-queue
    spec: JobSpec
    allocations: tuple[Allocation, ...]
    workdir: Path  # kept across attempts so a preempted job resumes from its checkpoint
    env: dict[str, str] = field(default_factory=dict)  # platform-injected, e.g. CALDERA_JOB_ID
    base_url: str = ""  # for interactive jobs: the path the platform proxies, e.g. /jobs/<id>/lab/
    run_as: RunAs | None = None  # None: as the server's own user (only when an admin chose run_jobs_as=server)
    home: Path | None = None  # the owner's own space: HOME, and the only host path the job may write
    authorized_keys: str = ""  # the owner's SSH public keys, one OpenSSH line each: for SSH into their own job
    # storage spaces the spec mounts (caldera.server.files.host_mounts): (host path, path in the job, writable)
    mounts: tuple[tuple[str, str, bool], ...] = ()


@dataclass
class Handle:
    job_id: str
    attempt: int
    data: dict[str, Any] = field(default_factory=dict)  # JSON-serialisable; persisted by the server


class Phase(str, Enum):
    STARTING = "Starting"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    LOST = "Lost"


@dataclass(frozen=True)
class Observation:
    phase: Phase
    exit_code: int | None = None
    reason: str = ""  # machine-readable, e.g. "ExitCode", "ProcessGone"
    message: str = ""


@dataclass(frozen=True)
class Endpoint:
    """An HTTP service a job exposes, reachable only by the platform's proxy."""

    name: str  # e.g. "lab"
    host: str
    port: int
    base_url: str  # path prefix the service expects
    headers: dict[str, str] = field(default_factory=dict)  # what the proxy adds (the service's login); never shown
    socket: str | None = None  # a Unix socket only the platform may open; host and port are then unused
    secrets: tuple[str, ...] = ()  # what the service may print into pages and the proxy must cut out (its token)


@dataclass(frozen=True)
class ProcessUsage:
    """What a job's processes use now, from a runtime that can see them (an optional ``usage(handle)`` method)."""

    cpu_s: float  # CPU seconds (user + system) its live processes have spent so far
    rss_mib: float  # resident memory of its live processes


class LaunchError(RuntimeError):
    """A launch that did not happen, with a machine-readable ``reason`` (e.g. "CommandNotFound", "ImageNotFound",
    "RuntimeUnavailable") next to the message a person reads. Nothing of the job is left running."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class ExecError(RuntimeError):
    """A command that could not be started inside a job, with a machine-readable ``reason`` ("NotRunning",
    "NoSuchRank", "NotSupported") next to the message a person reads."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


class Runtime(Protocol):
    name: str

    def nodes(self) -> list[Node]:
        """The nodes and devices this runtime can run jobs on."""

    def launch(self, req: LaunchRequest) -> Handle:
        """Start every process of the job, all or none; raises LaunchError if it cannot. May take seconds (the
        platform calls it off its scheduling loop)."""

    def observe(self, handle: Handle) -> Observation:
        """Current phase. Works for a handle from before a server restart (re-attach)."""

    def stop(self, handle: Handle, grace_s: float, notice: str | None = None) -> None:
        """SIGTERM to every process group, SIGKILL after ``grace_s``. Returns at once. With ``notice`` (preemption),
        first writes it to the file named by the job's CALDERA_PREEMPT_NOTICE variable."""

    def logs(self, handle: Handle, rank: int | None = None, follow: bool = False, offset: int = 0) -> Iterator[bytes]:
        """Log bytes of one rank (rank 0 when None) from ``offset``; with ``follow``, until the job ends."""

    def endpoints(self, handle: Handle) -> list[Endpoint]:
        """Services of an interactive job, once it is running."""

    def exec(self, handle: Handle, rank: int, argv: list[str], tty: bool, term: str = "") -> ExecProcess:
        """Start ``argv`` inside a running rank, as the job's uid with the job's view of the host (its namespaces,
        its container), on a PTY when ``tty``. ``argv`` reaches no root process except as data after ``--``, and
        the command runs only once privileges are dropped. Raises ExecError. See ``runtime.exec_process``."""


def nodes_of(runtime: Runtime, handle: Handle, placed: Iterable[str]) -> set[str]:
    """The nodes a job attempt runs on. A runtime whose cluster places jobs itself (``admits_jobs``: Kubernetes,
    where kube-scheduler picks the node) says where its processes are by a ``running_on(handle) -> set[str]``
    method; for every other runtime that is where Caldera placed them (``placed``, its allocations' nodes)."""
    running_on = getattr(runtime, "running_on", None)
    return set(running_on(handle)) if running_on is not None else set(placed)


OTHER_HOLDER = "other"  # a device held by something the platform did not start (another tenant of the cluster)


def gpu_holders(runtime: Runtime) -> dict[str, list[str | None]] | None:
    """Who holds each GPU of each node, where the runtime's cluster places jobs itself (``admits_jobs``): a
    ``gpu_holders() -> {node: [job id, OTHER_HOLDER or None (free), ...]}`` method, from what the cluster runs.
    None for every other runtime: there the platform's own allocations say it."""
    holders = getattr(runtime, "gpu_holders", None)
    return holders() if holders is not None else None
