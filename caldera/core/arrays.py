"""Job arrays as Slurm writes them (``--array 0-99%8``): which task indices an expression names, how many may run
at once, and the one state an array shows for its tasks' states."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from caldera.core.states import JobState

MAX_ARRAY_EXPRESSION_CHARS = 256
MAX_ARRAY_INDEX = 1_000_000  # indices are task numbers, not data: a bound keeps a range's arithmetic small
_PART = re.compile(r"(\d{1,7})(?:-(\d{1,7})(?::(\d{1,7}))?)?", re.ASCII)


@dataclass(frozen=True)
class ArrayRange:
    expression: str
    indices: tuple[int, ...]  # ascending, each once
    max_running: int | None  # %N: at most N tasks running at once; None: no limit of its own


def parse_array(expression: str, max_size: int) -> ArrayRange:
    """``0-99%8``, ``1,3,5``, ``0-20:5``, or several of them comma-separated, with one optional ``%N`` at the
    end; at most ``max_size`` tasks. A ValueError says what is wrong, in words for the submitter."""
    text = expression.strip()
    if not text or len(text) > MAX_ARRAY_EXPRESSION_CHARS:
        raise ValueError(f"give 1 to {MAX_ARRAY_EXPRESSION_CHARS} characters, such as 0-99%8")
    body, sep, limit = text.partition("%")
    max_running = None
    if sep:
        if not re.fullmatch(r"\d{1,7}", limit, re.ASCII) or int(limit) < 1:
            raise ValueError(f"%{limit}: the limit of running tasks is a whole number of at least 1")
        max_running = int(limit)
    indices: set[int] = set()
    for part in body.split(","):
        m = _PART.fullmatch(part.strip())
        if m is None:
            raise ValueError(f"{part.strip()[:32]!r}: expected N, N-M or N-M:STEP")
        first = int(m.group(1))
        last = int(m.group(2)) if m.group(2) is not None else first
        step = int(m.group(3)) if m.group(3) is not None else 1
        if last < first or step < 1 or last > MAX_ARRAY_INDEX:
            raise ValueError(
                f"{part.strip()!r}: a range goes up, by a step of at least 1, to {MAX_ARRAY_INDEX} at most"
            )
        if len(indices) + (last - first) // step + 1 > max_size:  # counted before it is made
            raise ValueError(f"more than {max_size} tasks (the platform's max_array_size)")
        indices.update(range(first, last + 1, step))
    if len(indices) > max_size:
        raise ValueError(f"more than {max_size} tasks (the platform's max_array_size)")
    return ArrayRange(text, tuple(sorted(indices)), max_running)


def array_state(states: Iterable[JobState]) -> JobState:
    """Running while any task holds resources, Queued while any waits, then Succeeded if every task did, else
    Failed if any failed or was lost, else Cancelled."""
    seen = set(states)
    if any(s.active for s in seen):
        return JobState.RUNNING
    if seen - {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.LOST}:
        return JobState.QUEUED
    if seen <= {JobState.SUCCEEDED}:
        return JobState.SUCCEEDED
    return JobState.FAILED if seen & {JobState.FAILED, JobState.LOST} else JobState.CANCELLED
