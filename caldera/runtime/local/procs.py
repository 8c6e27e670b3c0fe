"""Linux /proc helpers: identify a process safely and find every process that belongs to a job.

Standard library only: the supervisor shim imports this and must start fast.

A pid alone does not identify a process (pids are reused), so everywhere we keep (pid, start time) where the start
time is field 22 of /proc/<pid>/stat (clock ticks since boot; fixed for the life of the process, unchanged by exec).
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

TAG_VAR = "CALDERA_RUN_TAG"  # "<job_id>/<attempt>/<rank>", set on every process of a job (inherited by children)


@dataclass(frozen=True, slots=True)
class ProcStat:
    state: str
    ppid: int
    pgrp: int
    start: int
    cpu_ticks: int = 0  # user + system time, clock ticks
    rss_pages: int = 0


def stat(pid: int) -> ProcStat | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # comm (field 2) may hold spaces and parentheses: split after the last ')'
    fields = data[data.rindex(b")") + 2 :].split()
    return ProcStat(
        state=fields[0].decode(),
        ppid=int(fields[1]),
        pgrp=int(fields[2]),
        start=int(fields[19]),
        cpu_ticks=int(fields[11]) + int(fields[12]),
        rss_pages=int(fields[21]),
    )


def start_time(pid: int) -> int | None:
    st = stat(pid)
    return st.start if st else None


def is_alive(pid: int | None, start: int | None) -> bool:
    """The very process recorded as (pid, start) still runs (a zombie counts as gone: it has exited)."""
    if not pid:
        return False
    st = stat(pid)
    return st is not None and st.start == start and st.state not in ("Z", "X")


def signal_verified(pid: int | None, start: int | None, sig: int) -> bool:
    if not is_alive(pid, start):
        return False
    try:
        os.kill(pid, sig)  # type: ignore[arg-type]
        return True
    except ProcessLookupError:
        return False


def _pids() -> list[int]:
    return [int(n) for n in os.listdir("/proc") if n.isdigit()]


def _tag_of(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read()
    except OSError:
        return None
    key = TAG_VAR.encode() + b"="
    for item in env.split(b"\0"):
        if item.startswith(key):
            return item[len(key) :].decode(errors="replace")
    return None


def job_processes(pgrps: set[int], tag: str | None = None, tag_prefix: str | None = None) -> list[int]:
    """Live processes in any of ``pgrps``, plus those whose run tag equals ``tag`` or starts with ``tag_prefix``.

    The tag catches what left the process group (Jupyter starts each kernel in a new session). Only used when a
    job or rank ends or is killed, never on the per-second observe path: it reads every process's /proc entry.
    """
    me = os.getpid()
    found = []
    for pid in _pids():
        if pid == me:
            continue
        st = stat(pid)
        if st is None or st.state in ("Z", "X"):
            continue
        if st.pgrp in pgrps:
            found.append(pid)
            continue
        if tag is None and tag_prefix is None:
            continue
        t = _tag_of(pid)
        if t is not None and (t == tag or (tag_prefix is not None and t.startswith(tag_prefix))):
            found.append(pid)
    return found


def children(pid: int) -> list[int]:
    """The live children of ``pid``."""
    return [c for c in _pids() if (st := stat(c)) is not None and st.ppid == pid and st.state not in ("Z", "X")]


def kill_all(pids: list[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
_PAGE_MIB = os.sysconf("SC_PAGE_SIZE") / 2**20


def cpu_and_rss(pids: list[int]) -> tuple[float, float]:
    """CPU seconds (user + system) spent so far and resident MiB now, summed over the live ``pids``."""
    stats = [s for s in map(stat, pids) if s is not None]
    return sum(s.cpu_ticks for s in stats) / _TICKS_PER_S, sum(s.rss_pages for s in stats) * _PAGE_MIB
