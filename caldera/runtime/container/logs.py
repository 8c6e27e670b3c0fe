"""A rank's log as the bytes the job wrote. conmon stores it in the Kubernetes log format, one record per line:

    2026-12-03T18:14:41.013202277+00:00 stdout P part
    2026-12-03T18:14:42.016530390+00:00 stdout F done

``F`` closes a line (its newline was cut), ``P`` is part of one. Offsets count the job's bytes, not the file's, so
a reader resumes where it stopped whichever runtime wrote the log.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

_CHUNK = 64 * 1024


def decode_record(line: bytes) -> bytes:
    parts = line.split(b" ", 3)
    if len(parts) < 3:
        return b""
    content = parts[3] if len(parts) == 4 else b""
    return content + b"\n" if parts[2] == b"F" else content


def read(path: Path, offset: int, follow: bool, ended: Callable[[], bool]) -> Iterator[bytes]:
    """The job's bytes from ``offset``; with ``follow``, until ``ended()`` says nothing more will be written."""
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed by the with below; the generator outlives this statement
    except OSError:
        return
    with f:
        skip, pending = max(0, offset), b""
        while True:
            data = f.read(_CHUNK)
            if not data:
                if not follow:
                    return
                if ended():
                    follow = False  # read once more: what is there now is all there will be
                    continue
                time.sleep(0.1)
                continue
            *lines, pending = (pending + data).split(b"\n")  # a record half-written stays pending
            out = b"".join(decode_record(line) for line in lines)
            if skip:
                cut = min(skip, len(out))
                out, skip = out[cut:], skip - cut
            if out:
                yield out
