"""Request-scoped dependencies: the platform, a database session, the authenticated user, the admin check."""

from __future__ import annotations

import time
from collections.abc import Iterator

from fastapi import Depends, HTTPException, Request
from sqlalchemy import select
from sqlalchemy.orm import Session

from caldera.core.tenancy import Role
from caldera.db.models import ApiToken, User
from caldera.server.platform import Platform
from caldera.server.security import (
    PERSONAL_PREFIX,
    SESSION_PREFIX,
    TokenError,
    credentials_current,
    decode_access,
    hash_token,
)

SESSION_COOKIE = "caldera_session"


def platform(request: Request) -> Platform:
    return request.app.state.platform


def db_session(p: Platform = Depends(platform)) -> Iterator[Session]:
    with p.session() as db:
        yield db


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(401, detail, headers={"WWW-Authenticate": "Bearer"})


def presented_token(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.cookies.get(SESSION_COOKIE)


def user_for_token(p: Platform, db: Session, token: str) -> User:
    if token.startswith((PERSONAL_PREFIX, SESSION_PREFIX)):
        row = db.scalar(select(ApiToken).where(ApiToken.token_hash == hash_token(token)))
        now = time.time()
        if row is None or row.revoked_at is not None or (row.expires_at is not None and row.expires_at < now):
            raise _unauthorized("invalid or revoked token")
        if row.last_used_at is None or now - row.last_used_at > 60:  # not a write per request
            row.last_used_at = now
            db.commit()
        user = db.get(User, row.user_id)
        issued_at = row.created_at if row.kind == "session" else float("inf")  # personal tokens outlive a password
    else:
        try:
            user_id, issued_at = decode_access(p.keys, token)
        except TokenError as exc:
            raise _unauthorized(str(exc)) from None
        user = db.get(User, user_id)
    if user is None or not user.active:
        raise _unauthorized("user disabled")
    if not credentials_current(user, issued_at):
        raise _unauthorized("the password changed since this token was issued; log in again")
    return user


def current_user(request: Request, p: Platform = Depends(platform), db: Session = Depends(db_session)) -> User:
    token = presented_token(request)
    if not token:
        raise _unauthorized("not authenticated")
    return user_for_token(p, db, token)


def admin_user(user: User = Depends(current_user)) -> User:
    if user.role != Role.ADMIN.value:
        raise HTTPException(403, "admins only")
    return user
