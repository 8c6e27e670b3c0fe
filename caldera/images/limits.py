"""CPU and memory limits of one build: a cgroup that root makes and the build's first process joins before it
becomes the build user, so everything the build starts stays inside. A rootless runc cannot set limits itself
(without systemd there is no cgroup delegated to the build user); the build's steps inherit these instead. Works on
cgroup v2 and on v1 (hybrid hosts), and kills whatever is left in it at the end."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")
PARENT = "caldera-builds"
PERIOD_US = 100_000


class LimitsUnavailable(RuntimeError):
    pass


def _write(path: Path, value: str) -> None:
    path.write_text(value)


class BuildCgroup:
    def __init__(self, name: str, memory_mib: int, cpus: float):
        self.name, self.memory, self.quota = name, memory_mib << 20, int(PERIOD_US * cpus)
        self.v2 = (CGROUP / "cgroup.controllers").exists()
        if self.v2:
            self.dirs = [CGROUP / PARENT / name]
        else:
            self.dirs = [CGROUP / "memory" / PARENT / name, CGROUP / "cpu" / PARENT / name]

    def create(self) -> None:
        try:
            if self.v2:
                for parent in (CGROUP, CGROUP / PARENT):
                    parent.mkdir(exist_ok=True)
                    _write(parent / "cgroup.subtree_control", "+memory +cpu")
                self.dirs[0].mkdir(exist_ok=True)
                _write(self.dirs[0] / "memory.max", str(self.memory))
                if (self.dirs[0] / "memory.swap.max").exists():  # absent without swap accounting
                    _write(self.dirs[0] / "memory.swap.max", "0")
                _write(self.dirs[0] / "cpu.max", f"{self.quota} {PERIOD_US}")
            else:
                memory, cpu = self.dirs
                for d in self.dirs:
                    d.mkdir(parents=True, exist_ok=True)
                _write(memory / "memory.limit_in_bytes", str(self.memory))
                _write(cpu / "cpu.cfs_period_us", str(PERIOD_US))
                _write(cpu / "cpu.cfs_quota_us", str(self.quota))
        except OSError as exc:
            raise LimitsUnavailable(f"cannot make the build's cgroup: {exc}") from None

    def join(self) -> None:
        """In the child, before it drops root (preexec_fn): plain writes only."""
        for d in self.dirs:
            fd = os.open(d / "cgroup.procs", os.O_WRONLY)
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)

    def pids(self) -> list[int]:
        try:
            return [int(x) for x in (self.dirs[0] / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def remove(self) -> None:
        """Kills what the build left running (a step after a timeout) and removes the cgroup."""
        deadline = time.monotonic() + 10
        while (pids := self.pids()) and time.monotonic() < deadline:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.1)
        for d in self.dirs:
            try:
                d.rmdir()
            except OSError:
                pass
