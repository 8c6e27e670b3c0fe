"""Connections the platform opens to a URL a user gave (a webhook, an import): the platform must not become their
way into its own network. The URL must be an http(s) URL of a host, ASCII, without credentials (``check_url``); the
host is resolved once, every address must be public (or inside networks an admin allowed), and the connection goes
to the address that was checked (no second lookup to rebind); TLS still checks the certificate against the URL's
host name. The one place for these checks: webhooks and imports both come here."""

from __future__ import annotations

import http.client
import ipaddress
import socket
from collections.abc import Iterable, Sequence
from urllib.parse import urlsplit

SCHEMES = ("http", "https")
MAX_URL_CHARS = 2048
Networks = Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network]


class OutboundRefused(Exception):
    """The URL or its address may not be reached, or cannot be resolved: the reason in words."""


def networks(cidrs: Iterable[str]) -> Networks:
    """An admin's setting of allowed non-public networks (validated when the settings load)."""
    return [ipaddress.ip_network(n) for n in cidrs]


def check_url(url: str) -> None:
    """Refuse, with the reason, a URL that is not an http(s) URL of a host, without credentials."""
    # ASCII only: the request line is ASCII (http.client raises UnicodeEncodeError, in a thread of its own for an
    # import); other characters are sent percent-encoded
    if len(url) > MAX_URL_CHARS or any(not 33 <= ord(c) < 127 for c in url):
        raise OutboundRefused(
            f"a URL of at most {MAX_URL_CHARS} ASCII characters (others percent-encoded), without spaces or control "
            "characters"
        )
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise OutboundRefused(f"only {' and '.join(SCHEMES)} URLs")
    if parts.username is not None or parts.password is not None:
        raise OutboundRefused("a URL with credentials in it is refused (they would be stored with it)")
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        raise OutboundRefused("the URL's port is not a number") from None
    if not parts.hostname:
        raise OutboundRefused("the URL names no host")


def checked_url(url: str, allowed: Networks) -> str:
    """The address to connect to for ``url``, refused (OutboundRefused) as ``check_url`` and ``checked_address``
    say."""
    check_url(url)
    parts = urlsplit(url)
    return checked_address(parts.hostname or "", parts.port or 0, allowed)


def open_connection(url: str, allowed: Networks, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    """An unopened connection for ``url`` to an address of its host that was checked, and the path to ask for."""
    parts = urlsplit(url)
    conn = connection(url, checked_url(url, allowed), timeout)
    return conn, (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


def checked_address(host: str, port: int, allowed: Networks) -> str:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise OutboundRefused(f"cannot resolve {host}: {exc}") from None
    addresses = {info[4][0] for info in infos}
    for address in addresses:
        ip = ipaddress.ip_address(address.split("%")[0])
        if not _allowed(ip, allowed) and not all(public or _allowed(v4, allowed) for v4, public in _judged(ip)):
            raise OutboundRefused(f"{host} is a non-public address ({address}), refused")
    return sorted(addresses)[0]


# IPv6 ranges that carry an IPv4 address a gateway may forward to: the IPv4 address is judged too
_CARRYING_LOW_32_BITS = tuple(
    ipaddress.ip_network(net)
    for net in ("64:ff9b::/96", "64:ff9b:1::/48", "::/96", "::ffff:0:0:0/96")  # NAT64, IPv4-compatible, -translated
)
_SITE_LOCAL = ipaddress.ip_network("fec0::/10")  # deprecated, yet is_global holds for it


_Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def _judged(ip: _Address) -> list[tuple[_Address, bool]]:
    """Each IPv4 address an IPv6 address carries (mapped, NAT64, 6to4, Teredo, IPv4-compatible or -translated),
    else the address itself, each with whether it is public: a gateway forwards to what it carries."""
    if isinstance(ip, ipaddress.IPv4Address):
        return [(ip, ip.is_global)]
    carried = [ip.ipv4_mapped, ip.sixtofour, ip.teredo[1] if ip.teredo else None]
    if any(ip in net for net in _CARRYING_LOW_32_BITS):
        carried.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    inner = [(v4, v4.is_global) for v4 in carried if v4 is not None]
    return inner or [(ip, ip.is_global and ip not in _SITE_LOCAL)]


def _allowed(ip: _Address, allowed: Networks) -> bool:
    return any(ip in net for net in allowed)


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
