"""A rank's log file read as it grows: the raw bytes the job wrote (the process runtime's files, and the Kubernetes
runtime's copies of pod logs), from an offset, until the job has ended."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

_CHUNK = 64 * 1024


def follow_file(
    path: Path, offset: int, follow: bool, ended: Callable[[], bool], settle_s: float = 0.0
) -> Iterator[bytes]:
    """Bytes from ``offset``; with ``follow``, until ``ended()`` says nothing writes to the file any more. ``settle_s``
    waits before the last read, for a writer that copies the job's output with a lag."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - the generator outlives this try; closed by the with below
    except OSError:
        return
    with f:
        f.seek(max(0, offset))
        while True:
            chunk = f.read(_CHUNK)
            if chunk:
                yield chunk
                continue
            done = not follow or ended()
            if done:  # what is there now (after the writer's lag) is all there will be
                if settle_s:
                    time.sleep(settle_s)
                while chunk := f.read(_CHUNK):
                    yield chunk
                return
            time.sleep(0.1)
