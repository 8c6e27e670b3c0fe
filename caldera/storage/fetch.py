"""Import from URL: a download into a space, made by the server for a user. The server reaches what users cannot
(its own loopback services, the cluster's private network, a cloud's metadata address), so the URL passes two
allowlists: its scheme (http, https; no credentials in it) and its host's addresses (public ones, or inside
``storage_import_allowed_networks``, which an admin sets), connected to as checked (``caldera.outbound``: a name
that resolves elsewhere a moment later changes nothing). Each redirect is checked the same way. The bytes go to a
part file in the space's upload folder and become the file only when complete, within the size limit and the
space's quota; a restart asks for the rest (``Range``) and starts over when the server will not give it."""

from __future__ import annotations

import http.client
import ipaddress
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from urllib.parse import urljoin, urlsplit

from caldera import outbound
from caldera.config import Settings
from caldera.storage.errors import PathRefused

MAX_URL_CHARS = 2048
_REDIRECTS = 5
_TIMEOUT_S = 30.0
Networks = Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network]


def allowed_networks(settings: Settings) -> Networks:
    return [ipaddress.ip_network(n) for n in settings.storage_import_allowed_networks]


class FetchFailed(Exception):
    """Why a download stopped, in words for its owner; ``resumable``: the connection broke, and a restart asks
    for the rest (else the bytes so far are dropped)."""

    def __init__(self, message: str, resumable: bool = False):
        super().__init__(message)
        self.resumable = resumable


def check_url(url: str) -> None:
    """Refuse, with the reason, a URL that is not an http(s) URL of a host, without credentials."""
    # ASCII only: the request line is ASCII (http.client raised UnicodeEncodeError in the import's thread, which left
    # the import running for ever); other characters are sent percent-encoded
    if len(url) > MAX_URL_CHARS or any(not 33 <= ord(c) < 127 for c in url):
        raise PathRefused(
            f"a URL of at most {MAX_URL_CHARS} ASCII characters (others percent-encoded), without spaces or control "
            "characters"
        )
    parts = urlsplit(url)
    if parts.scheme not in outbound.SCHEMES:
        raise PathRefused(f"only {' and '.join(outbound.SCHEMES)} URLs can be imported")
    if parts.username is not None or parts.password is not None:
        raise PathRefused("a URL with credentials in it is not imported (they would be kept with the import)")
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        raise PathRefused("the URL's port is not a number") from None
    if not parts.hostname:
        raise PathRefused("the URL names no host")


@contextmanager
def open_stream(url: str, allowed: Networks, offset: int) -> Iterator[tuple[http.client.HTTPResponse, int]]:
    """The response for ``url`` (redirects followed, each checked) asked from ``offset``; and the offset it gives:
    ``offset`` when the server sends the rest (206), 0 when it sends everything again (200)."""
    for _ in range(_REDIRECTS + 1):
        check_url(url)
        parts = urlsplit(url)
        try:
            address = outbound.checked_address(parts.hostname or "", parts.port or 0, allowed)
        except outbound.OutboundRefused as exc:
            raise FetchFailed(f"{exc} (an admin may allow it: storage_import_allowed_networks)") from None
        conn = outbound.connection(url, address, _TIMEOUT_S)
        try:
            headers = {"Accept-Encoding": "identity", **({"Range": f"bytes={offset}-"} if offset else {})}
            conn.request("GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""), headers=headers)
            response = conn.getresponse()
            if response.status in (301, 302, 303, 307, 308) and response.getheader("Location"):
                url = urljoin(url, response.getheader("Location", ""))
                continue
            if response.status == 206 and offset:
                yield response, offset
            elif response.status == 200:
                yield response, 0
            else:
                raise FetchFailed(f"the server answered {response.status} {response.reason}")
            return
        except (OSError, http.client.HTTPException) as exc:
            raise FetchFailed(f"the download broke off: {exc}", resumable=True) from None
        finally:
            conn.close()
    raise FetchFailed(f"more than {_REDIRECTS} redirects")


def total_of(response: http.client.HTTPResponse, offset: int) -> int | None:
    length = response.getheader("Content-Length", "")
    return offset + int(length) if length.isascii() and length.isdigit() else None  # "²" is a digit to isdigit


def copy(response: http.client.HTTPResponse, fd: int, done: int, limit: int, progress: Callable[[int], None]) -> int:
    """Append the body to ``fd`` (which has ``done`` bytes), at most ``limit`` bytes in all; the bytes it has."""
    while block := response.read(1 << 20):
        if done + len(block) > limit:
            raise FetchFailed(f"larger than the {limit} bytes it may bring")
        view = memoryview(block)
        while view:
            view = view[os.write(fd, view) :]
        done += len(block)
        progress(done)
    return done
