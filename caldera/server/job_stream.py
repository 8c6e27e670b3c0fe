"""A job's live view as server-sent events: its state whenever it changes and one rank's log as it grows, on one
connection, so a page neither polls for the state nor for the log.

Events: ``state`` (JSON: state, attempt, exit_code, message), ``log`` (JSON string: text the job wrote; its ``id`` is
``<attempt>:<byte offset>`` so a reconnecting EventSource resumes where it stopped), ``attempt`` (a new attempt's log
starts from its beginning) and ``end`` (the job ended and its whole log was sent; nothing follows).
"""

from __future__ import annotations

import codecs
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from caldera.core.states import JobState
from caldera.db.models import Job
from caldera.runtime.base import Handle
from caldera.server.platform import Platform

KEEPALIVE_S = 15.0  # a comment line now and then, so a client that went away is noticed on the next write
_FLOWING_S, _IDLE_S = 0.2, 0.5


@dataclass(frozen=True)
class _Seen:
    state: str
    attempt: int
    exit_code: int | None
    message: str | None
    handle: dict | None


def parse_resume(last_event_id: str | None) -> tuple[int, int] | None:
    """``(attempt, offset)`` from a ``Last-Event-ID`` this stream sent, None for anything else."""
    try:
        attempt, offset = (int(x) for x in (last_event_id or "").split(":"))
    except ValueError:
        return None
    return (attempt, offset) if attempt >= 0 and 0 <= offset < 1 << 40 else None


def event(kind: str, data: object, event_id: str | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {kind}\ndata: {json.dumps(data)}\n\n".encode()


def live_events(
    p: Platform,
    job_id: str,
    rank: int | None,
    resume: tuple[int, int] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[bytes]:
    """The stream of one job, until it has ended and its log was read to the end. The state is read before the log
    each round, so a log read after a terminal state is complete."""
    attempt, offset = resume if resume else (-1, 0)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    last: _Seen | None = None
    quiet_since = time.monotonic()
    while True:
        seen = _read(p, job_id)
        if seen is None:
            return
        if seen != last:
            yield event("state", _state(seen))
            last = seen
        if seen.attempt != attempt:
            if attempt >= 0:
                yield event("attempt", seen.attempt)
                offset = 0
            attempt = seen.attempt
            decoder.reset()
        got = 0
        if seen.handle:
            for chunk in p.runtime.logs(Handle(job_id, attempt, seen.handle), rank=rank, offset=offset):
                got += len(chunk)
                offset += len(chunk)
                text = decoder.decode(chunk)
                pending = len(decoder.getstate()[0])  # a character cut in two is sent with its second half
                if text:
                    yield event("log", text, f"{attempt}:{offset - pending}")
        if JobState(seen.state).terminal and not got:
            yield event("end", _state(seen))
            return
        if got:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since > KEEPALIVE_S:
            yield b": keepalive\n\n"
            quiet_since = time.monotonic()
        sleep(_FLOWING_S if got else _IDLE_S)


def _read(p: Platform, job_id: str) -> _Seen | None:
    with p.session() as s:
        j = s.get(Job, job_id)
        if j is None:
            return None
        return _Seen(j.state, j.attempt, j.exit_code, j.message, j.handle or None)


def _state(seen: _Seen) -> dict:
    return {"state": seen.state, "attempt": seen.attempt, "exit_code": seen.exit_code, "message": seen.message}
