"""CSRF protection for everything a browser can send with ambient credentials.

Contract (README "API security"; pages and their forms rely on it):

* Checked: every state-changing request (any method but GET, HEAD, OPTIONS) that carries no ``Authorization:
  Bearer`` header and either carries the ``caldera_session`` cookie or is not under ``/api/`` (the pages' forms,
  ``/login`` included: a forged login is an attack too). Bearer-token requests are exempt: a page of another
  site cannot add that header without a CORS preflight, which this server never answers. So are WebDAV's
  requests under ``/dav/`` but POST (PUT, DELETE, MOVE, PROPFIND... are beyond a form, and need that preflight).
* It passes when the request's ``Origin`` is the platform's own (``CALDERA_PUBLIC_URL``, or the scheme and
  ``Host`` the request came to; never a lab's origin). A request naming another origin is refused, whatever else
  it carries.
* Without an ``Origin`` (some privacy tools strip it) it passes on a same-origin ``Referer``, or on a double-submit
  token: the value of the ``caldera_csrf`` cookie repeated in the ``X-CSRF-Token`` header or, for
  ``application/x-www-form-urlencoded`` forms, in a ``csrf_token`` field.
* The server sets ``caldera_csrf`` (random, ``HttpOnly``, ``SameSite=Strict``: pages carry it in their forms,
  scripts never read it) on any page response that lacks it; a template gets the value with :func:`csrf_token`
  and puts it in a hidden field.
* A refusal is 403 with ``{"detail": "cross-site request refused (CSRF): ..."}``.
"""

from __future__ import annotations

import hmac
import json
import secrets
from http.cookies import CookieError, SimpleCookie
from urllib.parse import parse_qs, urlsplit

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from caldera.config import lab_job_of
from caldera.server.deps import SESSION_COOKIE

CSRF_COOKIE = "caldera_csrf"
CSRF_HEADER = "x-csrf-token"
CSRF_FIELD = "csrf_token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_FORM = "application/x-www-form-urlencoded"


def csrf_token(request: Request) -> str:
    """The token a page puts in its forms' ``csrf_token`` field (the cookie's value, set on this response when
    the browser has none yet)."""
    return request.scope.get("state", {}).get("csrf_token") or request.cookies.get(CSRF_COOKIE, "")


def origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower() if parts.scheme and parts.netloc else ""


def platform_origin(origin: str, public_origin: str, lab_url_template: str, host: str, scheme: str) -> bool:
    """Whether ``origin`` (scheme://host[:port], lower case) is the platform's own: ``CALDERA_PUBLIC_URL``'s, or the
    scheme and Host the request came to; never a lab's."""
    if not origin or lab_job_of(lab_url_template, urlsplit(origin).netloc):
        return False
    return origin in (public_origin, f"{scheme}://{host}".lower())


def _cookies(headers: dict[str, str]) -> dict[str, str]:
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(headers.get("cookie", ""))
    except CookieError:
        return {}
    return {k: m.value for k, m in jar.items()}


class CSRFMiddleware:
    def __init__(self, app: ASGIApp, public_url: str, lab_url_template: str, secure: bool = False):
        self.app = app
        self.public_origin = origin_of(public_url)
        self.lab_url_template = lab_url_template
        self.secure = secure

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        cookies = _cookies(headers)
        token = cookies.get(CSRF_COOKIE) or secrets.token_urlsafe(24)
        scope.setdefault("state", {})["csrf_token"] = token
        if self._checked(scope, headers, cookies):
            refusal, receive = await self._refusal(scope, headers, cookies, receive)
            if refusal:
                await _forbidden(send, refusal)
                return
        if CSRF_COOKIE in cookies or scope["path"].startswith("/api/"):
            await self.app(scope, receive, send)
            return

        async def send_with_cookie(message: Message) -> None:
            if message["type"] == "http.response.start":
                secure = "; Secure" if self.secure else ""
                attrs = f"{CSRF_COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict{secure}"
                message["headers"] = [*message.get("headers", []), (b"set-cookie", attrs.encode())]
            await send(message)

        await self.app(scope, receive, send_with_cookie)

    @staticmethod
    def _checked(scope: Scope, headers: dict[str, str], cookies: dict[str, str]) -> bool:
        if scope["method"] in SAFE_METHODS or headers.get("authorization", "").lower().startswith("bearer "):
            return False
        if scope["path"].startswith("/dav/") and scope["method"] != "POST":
            return False  # WebDAV's methods (PUT, DELETE, MOVE...) are beyond a form: another site needs CORS
        return SESSION_COOKIE in cookies or not scope["path"].startswith("/api/")

    def _own(self, origin: str, headers: dict[str, str], scheme: str) -> bool:
        return platform_origin(origin, self.public_origin, self.lab_url_template, headers.get("host", ""), scheme)

    async def _refusal(
        self, scope: Scope, headers: dict[str, str], cookies: dict[str, str], receive: Receive
    ) -> tuple[str | None, Receive]:
        """Why the request is refused (None: it passes), and the receive to go on with (a form's body is read
        here when its token field must be looked at, and handed on again)."""
        scheme = scope.get("scheme", "http")
        if "origin" in headers:
            if self._own(origin_of(headers["origin"]), headers, scheme):
                return None, receive
            return f"Origin {headers['origin'][:200]!r} is not this platform", receive
        if self._own(origin_of(headers.get("referer", "")), headers, scheme):
            return None, receive
        expected = cookies.get(CSRF_COOKIE, "")
        presented = headers.get(CSRF_HEADER, "")
        if not presented and headers.get("content-type", "").split(";")[0].strip().lower() == _FORM:
            body, receive = await _read_body(receive)
            presented = (parse_qs(body.decode("latin-1")).get(CSRF_FIELD) or [""])[0]
        if expected and presented and hmac.compare_digest(expected.encode(), presented.encode()):
            return None, receive
        return "no Origin, no same-origin Referer and no matching CSRF token", receive


async def _read_body(receive: Receive) -> tuple[bytes, Receive]:
    """The whole body (the body-size limit applies while reading), and a receive that replays it."""
    chunks: list[bytes] = []
    more = True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    body = b"".join(chunks)
    replayed = False

    async def replay() -> Message:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return body, replay


async def _forbidden(send: Send, why: str) -> None:
    body = json.dumps({"detail": f"cross-site request refused (CSRF): {why}"}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 403,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
