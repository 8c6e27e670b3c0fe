"""An in-memory runtime for API, loop and contract tests: jobs "run" by a scripted outcome, no process is started.

What a job does comes from its spec, the way a real command would decide it:

* ``["sleep", N]`` runs N seconds and exits 0; ``["true"]`` exits 0, ``["false"]`` exits 1 at once;
* any known program (``sh``, ``echo``, ...) follows the ``SCRIPT_*`` variables of its environment, which the contract
  suite's shell script (``tests.runtime.test_contract.SCRIPT``) also obeys on real runtimes:
  ``SCRIPT_OUTPUT`` (written to the log at start), ``SCRIPT_TENTHS`` (run time in tenths of a second),
  ``SCRIPT_EXIT`` (exit code), ``SCRIPT_ON_TERM`` (``exit``: exits 0 on SIGTERM; ``ignore``: killed at the deadline;
  otherwise SIGTERM kills it, exit 143);
* any other program fails the launch with ``LaunchError("CommandNotFound")``.

State lives in a "host" shared by every instance made from the same data directory, so a new instance (a restarted
server) re-attaches to the jobs an earlier one launched, as with real processes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from caldera.config import Settings
from caldera.core.cluster import Node
from caldera.core.spec import JobKind
from caldera.runtime.base import Endpoint, Handle, LaunchError, LaunchRequest, Observation, Phase
from caldera.runtime.local.gpus import discover_gpus

PROGRAMS = {"sh", "bash", "echo", "python", "python3", "sleep", "true", "false"}
_SIGTERM_EXIT, _SIGKILL_EXIT = 143, 137


@dataclass
class _Job:
    started_at: float
    world_size: int
    output: bytes
    run_s: float
    exit_code: int
    on_term: str
    stop_at: float | None = None  # SIGTERM
    kill_at: float | None = None  # SIGKILL deadline
    notice: str | None = None

    def ended_at(self) -> float | None:
        natural = self.started_at + self.run_s
        if self.stop_at is None or natural <= self.stop_at:
            return natural
        if self.on_term == "ignore":
            return min(natural, self.kill_at or natural)
        return self.stop_at

    def outcome(self) -> tuple[int, str]:
        end = self.ended_at()
        if self.stop_at is None or end is None or end < self.stop_at:
            return self.exit_code, "ExitCode"
        if self.on_term == "exit":
            return 0, "ExitCode"
        return (_SIGKILL_EXIT if self.on_term == "ignore" else _SIGTERM_EXIT), "Stopped"


@dataclass
class _Host:
    jobs: dict[tuple[str, int], _Job] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


_HOSTS: dict[Path, _Host] = {}
_HOSTS_LOCK = threading.Lock()


def _host(settings: Settings) -> _Host:
    with _HOSTS_LOCK:
        return _HOSTS.setdefault(Path(settings.data_dir).resolve(), _Host())


class FakeRuntime:
    name = "fake"

    def __init__(self, settings: Settings):
        self.settings = settings
        self.host = _host(settings)
        self.launched: list[LaunchRequest] = []  # what this instance was asked to run, for assertions

    def nodes(self) -> list[Node]:
        s = self.settings
        return [
            Node(
                name=s.node_name or "fake-node",
                cpu=float(s.node_cpu or 8),
                memory_mib=int(s.node_memory_mib or 65536),
                gpus=discover_gpus(s),
            )
        ]

    def launch(self, req: LaunchRequest) -> Handle:
        spec = req.spec
        argv = list(spec.command or ["python3"]) if spec.kind is not JobKind.JUPYTER else ["python3"]
        prog = argv[0].rsplit("/", 1)[-1]
        if prog not in PROGRAMS:
            raise LaunchError("CommandNotFound", f"command not found: {argv[0]}")
        env = {**spec.env, **req.env}
        job = _Job(
            started_at=time.time(),
            world_size=spec.world_size if spec.kind is JobKind.DISTRIBUTED else 1,
            output=env.get("SCRIPT_OUTPUT", "").encode(),
            run_s=int(env.get("SCRIPT_TENTHS", "0")) / 10,
            exit_code=int(env.get("SCRIPT_EXIT", "0")),
            on_term=env.get("SCRIPT_ON_TERM", ""),
        )
        if prog == "sleep":
            job.run_s, job.exit_code = float(argv[1]), 0
        elif prog in ("true", "false"):
            job.run_s, job.exit_code = 0.0, int(prog == "false")
        if spec.kind is JobKind.JUPYTER:
            job.run_s = float("inf")
        key = (req.job_id, req.attempt)
        with self.host.lock:
            old = self.host.jobs.get(key)
            if old is not None and old.ended_at() is not None and old.ended_at() > time.time():
                raise LaunchError("AlreadyRunning", f"attempt {req.attempt} of job {req.job_id} is already running")
            self.host.jobs[key] = job
        self.launched.append(req)
        return Handle(req.job_id, req.attempt, {"fake": True, "world_size": job.world_size})

    def _job(self, handle: Handle) -> _Job | None:
        return self.host.jobs.get((handle.job_id, handle.attempt))

    def observe(self, handle: Handle) -> Observation:
        job = self._job(handle)
        if job is None:
            return Observation(Phase.LOST, reason="NotFound", message="this attempt was never launched")
        end = job.ended_at()
        if end is None or end > time.time():
            return Observation(Phase.RUNNING)
        code, reason = job.outcome()
        phase = Phase.SUCCEEDED if code == 0 else Phase.FAILED
        msg = f"exited with code {code}" + (" after a stop request" if reason == "Stopped" else "")
        return Observation(phase, exit_code=code, reason=reason, message=msg)

    def stop(self, handle: Handle, grace_s: float, notice: str | None = None) -> None:
        job = self._job(handle)
        now = time.time()
        if job is None or job.stop_at is not None or (job.ended_at() or now) <= now:
            return
        job.notice, job.stop_at, job.kill_at = notice, now, now + max(0.0, grace_s)

    def logs(self, handle: Handle, rank: int | None = None, follow: bool = False, offset: int = 0) -> Iterator[bytes]:
        job = self._job(handle)
        if job is None:
            return iter(())
        r = 0 if rank is None else rank
        if not 0 <= r < job.world_size:
            raise ValueError(f"rank {r} does not exist (world size {job.world_size})")
        return self._follow(handle, job, follow, max(0, offset))

    def _follow(self, handle: Handle, job: _Job, follow: bool, offset: int) -> Iterator[bytes]:
        if job.output[offset:]:  # a scripted job writes all it ever writes as it starts
            yield job.output[offset:]
        while follow and self.observe(handle).phase is Phase.RUNNING:
            time.sleep(0.05)

    def endpoints(self, handle: Handle) -> list[Endpoint]:
        return []
