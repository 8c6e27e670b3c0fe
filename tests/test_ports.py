"""A port chosen for a server that binds it later is below the ephemeral range (where no outgoing connection takes
it meanwhile), free when chosen, and a taken one is passed over."""

import socket

from caldera import ports


def test_the_port_is_below_the_ephemeral_range_and_a_taken_one_is_passed_over(monkeypatch):
    first_ephemeral = int(ports._EPHEMERAL.read_text().split()[0])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", ports.unused_port()))
        busy = taken.getsockname()[1]
        assert ports._LOWEST <= busy < first_ephemeral
        draws = iter([busy, busy, busy + 1 if busy + 1 < first_ephemeral else busy - 1])
        monkeypatch.setattr(ports.random, "randrange", lambda a, b: next(draws))
        chosen = ports.unused_port()
    assert chosen != busy and abs(chosen - busy) == 1
    with socket.socket() as s:
        s.bind(("127.0.0.1", chosen))  # free indeed
