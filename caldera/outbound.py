"""Connections the platform opens to a URL a user gave (a webhook, an import): the platform must not become their
way into its own network. The host is resolved once, every address must be public (or inside networks an admin
allowed), and the connection goes to the address that was checked (no second lookup to rebind); TLS still checks
the certificate against the URL's host name."""

from __future__ import annotations

import http.client
import ipaddress
import socket
from collections.abc import Sequence
from urllib.parse import urlsplit

SCHEMES = ("http", "https")


class OutboundRefused(Exception):
    """The address may not be reached, or cannot be resolved: the reason in words."""


def checked_address(host: str, port: int, allowed: Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> str:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise OutboundRefused(f"cannot resolve {host}: {exc}") from None
    addresses = {info[4][0] for info in infos}
    for address in addresses:
        ip = ipaddress.ip_address(address.split("%")[0])
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if not ip.is_global and not any(ip in net for net in allowed):
            raise OutboundRefused(f"{host} is a non-public address ({address}), refused")
    return sorted(addresses)[0]


def connection(url: str, address: str, timeout: float) -> http.client.HTTPConnection:
    """An unopened connection for ``url`` that connects to ``address`` (from ``checked_address``)."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = kind(parts.hostname, port, timeout=timeout)
    conn._create_connection = lambda _addr, timeout, source: socket.create_connection(  # type: ignore[attr-defined]
        (address, port), timeout, source
    )
    return conn
