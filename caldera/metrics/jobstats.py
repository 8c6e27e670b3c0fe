"""A job's CPU, memory and I/O: from its cgroup (container runtime, cgroup v2) or by summing its process tree from
/proc (process runtime). CPU is cumulative seconds (a counter: Prometheus' rate() gives cores in use)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class JobStats:
    cpu_seconds: float
    memory_bytes: int
    read_bytes: int
    write_bytes: int


def process_tree() -> dict[int, list[int]]:
    """Every process's children, from one walk of /proc (the agent walks it once per round, not once per job)."""
    tree: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def process_tree_stats(roots: tuple[int, ...], tree: dict[int, list[int]] | None = None) -> JobStats:
    """The sum over ``roots`` and all their descendants (processes that vanish meanwhile count as nothing);
    ``tree``: ``process_tree()`` when the caller has one."""
    tree = process_tree() if tree is None else tree
    seen: set[int] = set()
    todo = list(roots)
    cpu, rss, rd, wr = 0.0, 0, 0, 0
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        todo.extend(tree.get(pid, ()))
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            cpu += (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime
            rss += int(fields[21]) * _PAGE
            for line in Path(f"/proc/{pid}/io").read_text().splitlines():
                key, _, value = line.partition(":")
                if key == "read_bytes":
                    rd += int(value)
                elif key == "write_bytes":
                    wr += int(value)
        except (OSError, ValueError, IndexError):
            continue
    return JobStats(cpu, rss, rd, wr)


def cgroup_stats(cgroup: Path) -> JobStats:
    """From a cgroup v2 directory: cpu.stat usage_usec, memory.current, io.stat rbytes/wbytes summed over devices."""
    cpu = 0.0
    for line in (cgroup / "cpu.stat").read_text().splitlines():
        if line.startswith("usage_usec "):
            cpu = int(line.split()[1]) / 1e6
    memory = int((cgroup / "memory.current").read_text())
    rd = wr = 0
    try:
        for line in (cgroup / "io.stat").read_text().splitlines():
            for part in line.split()[1:]:
                key, _, value = part.partition("=")
                rd += int(value) if key == "rbytes" else 0
                wr += int(value) if key == "wbytes" else 0
    except OSError:
        pass  # no io controller delegated: I/O unknown, not an error
    return JobStats(cpu, memory, rd, wr)
