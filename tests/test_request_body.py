"""caldera.server.request_body: a request's body taken by a thread while the event loop receives it ahead."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
from wsgidav.dav_error import DAVError

from caldera.server import request_body
from caldera.server.limits import BodyTooLarge
from caldera.server.request_body import RequestBody
from caldera.server.webdav import _Body


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def receiving(messages: list[dict]) -> tuple[list[int], object]:
    """A ``receive`` that answers ``messages`` in order, then waits forever; how many it answered so far."""
    answered = [0]

    async def receive() -> dict:
        if answered[0] == len(messages):
            await asyncio.Event().wait()
        answered[0] += 1
        message = messages[answered[0] - 1]
        if isinstance(message, Exception):
            raise message
        return message

    return answered, receive


def body(*pieces: bytes) -> list[dict]:
    return [{"type": "http.request", "body": p, "more_body": i < len(pieces) - 1} for i, p in enumerate(pieces)]


def test_reads_exactly_what_is_asked_across_pieces(loop):
    _, receive = receiving(body(b"ab", b"cde", b"", b"fgh"))
    stream = RequestBody(loop, receive)
    assert stream.read(4) == b"abcd"
    assert stream.read(1) == b"e"
    assert stream.read(-1) == b"fgh"
    assert stream.read(10) == b"" and stream.read() == b""


def test_receives_ahead_only_so_far_and_stops_when_closed(loop, monkeypatch):
    monkeypatch.setattr(request_body, "AHEAD", 4 * 1024)
    answered, receive = receiving(body(*[b"x" * 1024] * 100))
    stream = RequestBody(loop, receive)
    assert stream.read(1) == b"x"
    time.sleep(0.3)
    # what the thread took, and AHEAD more (plus the piece past it) waiting for it: not the whole body
    ahead = answered[0]
    assert 4 <= ahead <= 9
    assert stream.read(ahead * 1024) == b"x" * ahead * 1024
    time.sleep(0.3)
    assert ahead < answered[0] <= 2 * ahead + 1  # the thread took more: the loop received as much again
    task = stream._task
    stream.close()  # the answer went out with the body unread (a PUT refused halfway)
    time.sleep(0.2)
    assert task is not None and task.cancelled()


def test_a_body_cut_short_is_an_error_not_its_end(loop):
    _, receive = receiving([*body(b"a" * 10, b"b")[:1], {"type": "http.disconnect"}])
    stream = RequestBody(loop, receive)
    with pytest.raises(ConnectionResetError):
        stream.read(100)


def test_what_receive_raises_is_raised_in_the_thread_and_webdav_answers_its_status(loop):
    _, receive = receiving([*body(b"a" * 10, b"b")[:1], BodyTooLarge(10)])
    stream = RequestBody(loop, receive)
    assert stream.take() == [b"a" * 10]  # what arrived before it first: an upload chunk keeps it
    with pytest.raises(BodyTooLarge):
        stream.take()
    with pytest.raises(BodyTooLarge):
        stream.take()  # and again, never an end of the body
    _, receive = receiving([*body(b"a" * 10, b"b")[:1], BodyTooLarge(10)])
    with pytest.raises(DAVError) as refused:
        _Body(loop, receive).read(100)
    assert refused.value.value == 413  # WsgiDAV would answer anything else with 500


def test_take_gives_the_pieces_as_received(loop):
    _, receive = receiving(body(b"ab", b"", b"cde"))
    stream = RequestBody(loop, receive)
    got = []
    while pieces := stream.take():
        got += pieces
    assert got == [b"ab", b"cde"] and stream.take() == []
