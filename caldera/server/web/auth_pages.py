"""Log in, log out, choose the language."""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends, Form, HTTPException, Request
from fastapi.responses import RedirectResponse
from sqlalchemy import select
from sqlalchemy.orm import Session

from caldera.db.models import ApiToken
from caldera.server.api_auth import authenticate, create_opaque
from caldera.server.deps import SESSION_COOKIE, db_session, platform
from caldera.server.platform import Platform
from caldera.server.security import hash_token
from caldera.server.web.i18n import LANG_COOKIE, LANGUAGES
from caldera.server.web.render import page

router = APIRouter(include_in_schema=False)


def safe_next(url: str) -> str:
    # only same-site paths, never //host, /\host or a scheme: no open redirect
    return url if url.startswith("/") and not url.startswith(("//", "/\\")) else "/"


@router.get("/login")
def login_form(request: Request, next: str = "/"):
    return page(request, "login.html", next=safe_next(next[:2048]), error=None)


@router.post("/login")
def login(
    request: Request,
    username: str = Form(..., max_length=64),
    password: str = Form(..., max_length=1024),
    next: str = Form("/", max_length=2048),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
):
    try:
        user = authenticate(request, db, username, password)  # rate-limited, as slow for unknown names
    except HTTPException as exc:
        error = "throttled" if exc.status_code == 429 else "wrong"
        resp = page(request, "login.html", status=exc.status_code, next=safe_next(next), error=error, username=username)
        resp.headers.update(exc.headers or {})
        return resp
    secret, _ = create_opaque(db, user, "session", "browser", p.settings.session_ttl_s)
    resp = RedirectResponse(safe_next(next), 303)
    resp.set_cookie(
        SESSION_COOKIE,
        secret,
        max_age=p.settings.session_ttl_s,
        httponly=True,
        samesite="lax",
        secure=p.settings.url.startswith("https"),
        path="/",
    )
    return resp


@router.post("/logout")
def logout(request: Request, db: Session = Depends(db_session)):
    token = request.cookies.get(SESSION_COOKIE)
    if token:
        row = db.scalar(select(ApiToken).where(ApiToken.token_hash == hash_token(token)))
        if row is not None:
            row.revoked_at = time.time()
            db.commit()
    resp = RedirectResponse("/login", 303)
    resp.delete_cookie(SESSION_COOKIE, path="/")
    return resp


@router.post("/language")
def choose_language(
    lang: str = Form(..., max_length=8), next: str = Form("/", max_length=2048), p: Platform = Depends(platform)
):
    resp = RedirectResponse(safe_next(next), 303)
    if lang in LANGUAGES:
        resp.set_cookie(
            LANG_COOKIE, lang, max_age=365 * 86400, samesite="lax", secure=p.settings.url.startswith("https")
        )
    return resp
