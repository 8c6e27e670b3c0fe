"""CSRF for the portal's forms: double submit. Every page sets a random ``caldera_csrf`` cookie once and every form
carries the same value in a hidden ``csrf_token`` field; a cross-site page can make the browser send the cookie but
can neither read it nor guess it, so it cannot fill the field."""

from __future__ import annotations

import re
import secrets

from fastapi import Request, Response

CSRF_COOKIE = "caldera_csrf"
CSRF_FIELD = "csrf_token"
_SHAPE = re.compile(r"^[A-Za-z0-9_-]{32,64}$")


class CsrfRefused(Exception):
    pass


def form_token(request: Request) -> str:
    """The token this request's page puts in its forms: the browser's cookie, or a new one set with the page."""
    existing = request.cookies.get(CSRF_COOKIE, "")
    if _SHAPE.match(existing):
        return existing
    if not hasattr(request.state, "new_csrf"):
        request.state.new_csrf = secrets.token_urlsafe(32)
    return request.state.new_csrf


def set_cookie(request: Request, response: Response, secure: bool) -> None:
    new = getattr(request.state, "new_csrf", None)
    if new:
        response.set_cookie(CSRF_COOKIE, new, httponly=True, samesite="lax", secure=secure, path="/")


def verify(request: Request, submitted: str) -> None:
    cookie = request.cookies.get(CSRF_COOKIE, "")
    if not (_SHAPE.match(cookie) and secrets.compare_digest(cookie.encode(), submitted.encode())):
        raise CsrfRefused()
