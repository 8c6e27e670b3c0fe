"""Something that runs and writes a log (a job's rank, an image build), followed live as server-sent events: its
state whenever it changes and its log as it grows, on one connection, so a page polls for neither.

Events: ``state`` (JSON: the subject's fields, plus ``started``: whether it has a log yet), ``log`` (a JSON string:
text it wrote; the ``id`` is ``<attempt>:<byte offset>``, so a reconnecting EventSource resumes where it stopped),
``attempt`` (a new attempt's log starts from its beginning) and ``end`` (it has ended and its whole log was sent).
"""

from __future__ import annotations

import codecs
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from fastapi.responses import StreamingResponse

KEEPALIVE_S = 15.0  # a comment line now and then, so a client that went away is noticed on the next write
_FLOWING_S, _IDLE_S = 0.2, 0.5
_MAX_OFFSET = 1 << 40


@dataclass(frozen=True)
class Progress:
    """What the subject looks like now. ``source`` is what its log is read with (not compared: no event of its own)."""

    fields: dict[str, Any]
    ended: bool
    attempt: int = 0
    started: bool = True
    source: Any = field(default=None, compare=False)


def parse_resume(last_event_id: str | None) -> tuple[int, int] | None:
    """``(attempt, offset)`` from a ``Last-Event-ID`` this stream sent, None for anything else."""
    try:
        attempt, offset = (int(x) for x in (last_event_id or "").split(":"))
    except ValueError:
        return None
    return (attempt, offset) if attempt >= 0 and 0 <= offset < _MAX_OFFSET else None


def event(kind: str, data: object, event_id: str | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {kind}\ndata: {json.dumps(data)}\n\n".encode()


def live_events(
    read: Callable[[], Progress | None],
    read_log: Callable[[Progress, int], Iterator[bytes]],
    resume: tuple[int, int] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[bytes]:
    """The stream, until the subject has ended and its log was read to the end (or it is gone). The state is read
    before the log each round, so a log read after the end is complete."""
    attempt, offset = resume if resume else (-1, 0)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    last: Progress | None = None
    quiet_since = time.monotonic()
    while (now := read()) is not None:
        if now != last:
            yield event("state", {**now.fields, "started": now.started})
            last = now
        if now.attempt != attempt:
            if attempt >= 0:
                yield event("attempt", now.attempt)
                offset = 0
            attempt = now.attempt
            decoder.reset()
        got = 0
        if now.started:
            for chunk in read_log(now, offset):
                got += len(chunk)
                offset += len(chunk)
                text = decoder.decode(chunk)
                pending = len(decoder.getstate()[0])  # a character cut in two is sent with its second half
                if text:
                    yield event("log", text, f"{attempt}:{offset - pending}")
        if now.ended and not got:
            yield event("end", now.fields)
            return
        if got:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since > KEEPALIVE_S:
            yield b": keepalive\n\n"
            quiet_since = time.monotonic()
        sleep(_FLOWING_S if got else _IDLE_S)


def sse_response(events: Iterator[bytes]) -> StreamingResponse:
    return StreamingResponse(
        events, media_type="text/event-stream", headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    )
