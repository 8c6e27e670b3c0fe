"""Import from URL: a download into a space, made by the server for a user. The server reaches what users cannot
(its own loopback services, the cluster's private network, a cloud's metadata address), so the URL passes two
allowlists: its scheme (http, https; no credentials in it) and its host's addresses (public ones, or inside
``storage_import_allowed_networks``, which an admin sets), connected to as checked (``caldera.outbound``: a name
that resolves elsewhere a moment later changes nothing). Each redirect is checked the same way. The bytes go to a
part file in the space's upload folder and become the file only when complete, within the size limit and the
space's quota; a restart asks for the rest (``Range``) and starts over when the server will not give it."""

from __future__ import annotations

import http.client
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from urllib.parse import urljoin

from caldera import outbound
from caldera.config import Settings
from caldera.storage.direct_writer import DirectWriter

_REDIRECTS = 5
_TIMEOUT_S = 30.0


def allowed_networks(settings: Settings) -> outbound.Networks:
    return outbound.networks(settings.storage_import_allowed_networks)


class FetchFailed(Exception):
    """Why a download stopped, in words for its owner; ``resumable``: the connection broke, and a restart asks
    for the rest (else the bytes so far are dropped)."""

    def __init__(self, message: str, resumable: bool = False):
        super().__init__(message)
        self.resumable = resumable


def refused(exc: outbound.OutboundRefused) -> str:
    return f"{exc} (an admin may allow it: storage_import_allowed_networks)"


@contextmanager
def open_stream(url: str, allowed: outbound.Networks, offset: int) -> Iterator[tuple[http.client.HTTPResponse, int]]:
    """The response for ``url`` (redirects followed, each checked) asked from ``offset``; and the offset it gives:
    ``offset`` when the server sends the rest (206), 0 when it sends everything again (200)."""
    for _ in range(_REDIRECTS + 1):
        try:
            conn, path = outbound.open_connection(url, allowed, _TIMEOUT_S)
        except outbound.OutboundRefused as exc:
            raise FetchFailed(refused(exc)) from None
        try:
            headers = {"Accept-Encoding": "identity", **({"Range": f"bytes={offset}-"} if offset else {})}
            conn.request("GET", path, headers=headers)
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


def copy(
    response: http.client.HTTPResponse, part: DirectWriter, done: int, limit: int, progress: Callable[[int], None]
) -> int:
    """Append the body to ``part`` (which has ``done`` bytes), at most ``limit`` bytes in all; the bytes it has."""
    while block := response.read(1 << 20):
        if done + len(block) > limit:
            raise FetchFailed(f"larger than the {limit} bytes it may bring")
        part.write(block)
        done += len(block)
        progress(done)
    return done
