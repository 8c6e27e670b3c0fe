"""A port for a server that binds it later (a test server, a cluster component, a distributed job's rendezvous).

A port from ``bind(("127.0.0.1", 0))`` comes from the kernel's ephemeral range, from which every outgoing connection
also takes its local port: between the choice and the server's own bind, any connection on the host may take it
(a test cluster's Kueue found its metrics port taken that way, and every Kubernetes test of that session failed).
So the port is drawn below that range, where only servers that ask for a number bind, and is checked free."""

from __future__ import annotations

import random
import socket
from pathlib import Path

_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10_000  # above the well-known and most registered services' ports


def unused_port(host: str = "127.0.0.1") -> int:
    try:
        first_ephemeral = int(_EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        first_ephemeral = 32_768  # Linux's default
    if first_ephemeral <= _LOWEST + 1000:  # an unusual range: the kernel's choice is the best left
        return _kernels_choice(host)
    for _ in range(200):
        port = random.randrange(_LOWEST, first_ephemeral)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    return _kernels_choice(host)


def _kernels_choice(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
