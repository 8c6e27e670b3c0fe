"""Login, token refresh and personal API tokens."""

from __future__ import annotations

import math
import time

from fastapi import APIRouter, Depends, HTTPException, Request
from pydantic import BaseModel, Field
from sqlalchemy import select
from sqlalchemy.orm import Session

from caldera.db.models import ApiToken, RefreshToken, User
from caldera.server import authenticators, tenancy
from caldera.server.deps import current_user, db_session, platform
from caldera.server.params import RowId
from caldera.server.platform import Platform
from caldera.server.ratelimit import LoginThrottle
from caldera.server.security import (
    PERSONAL_PREFIX,
    SESSION_PREFIX,
    TokenError,
    decode_refresh,
    hash_token,
    issue_access,
    issue_refresh,
    new_opaque_token,
)

router = APIRouter(prefix="/api/v1", tags=["auth"])


class Credentials(BaseModel):
    username: str = Field(..., max_length=128)
    password: str = Field(..., max_length=1024)


class RefreshIn(BaseModel):
    refresh_token: str = Field(..., max_length=4096)


class TokenIn(BaseModel):
    name: str = Field("", max_length=128)
    expires_in_days: int | None = Field(None, ge=1, le=3650)


def client_address(request: Request) -> str:
    """The connection's address; a proxy's X-Forwarded-For only from CALDERA_TRUSTED_PROXIES (serve.proxy_options)."""
    return request.client.host if request.client else "?"


def authenticate(request: Request, db: Session, username: str, password: str) -> User:
    """The one password login (API and pages): rate-limited per name and per address, and as slow for a name that
    does not exist as for one that does (a dummy hash is verified instead)."""
    throttle: LoginThrottle = request.app.state.login_throttle
    address = client_address(request)
    wait = throttle.retry_after(username, address)
    if wait is not None:
        seconds = max(1, math.ceil(wait))
        raise HTTPException(
            429, f"too many failed logins; try again in {seconds} s", headers={"Retry-After": str(seconds)}
        )
    user = authenticators.first_match(request.app.state.authenticators, db, username, password)
    if user is None:
        throttle.failed(username, address)
        raise HTTPException(401, "wrong username or password")
    throttle.succeeded(username)
    return user


def _pair(p: Platform, db: Session, user: User) -> dict:
    refresh, jti, exp = issue_refresh(p.keys, user.id, p.settings.refresh_token_ttl_s)
    db.add(RefreshToken(jti=jti, user_id=user.id, expires_at=exp))
    db.commit()
    return {
        "access_token": issue_access(p.keys, user.id, p.settings.access_token_ttl_s),
        "refresh_token": refresh,
        "token_type": "bearer",
        "expires_in": p.settings.access_token_ttl_s,
    }


@router.post("/auth/login")
def login(
    body: Credentials, request: Request, p: Platform = Depends(platform), db: Session = Depends(db_session)
) -> dict:
    return _pair(p, db, authenticate(request, db, body.username, body.password))


@router.post("/auth/refresh")
def refresh(body: RefreshIn, p: Platform = Depends(platform), db: Session = Depends(db_session)) -> dict:
    """Rotates: the refresh token presented is spent, a new pair is returned."""
    try:
        user_id, jti = decode_refresh(p.keys, body.refresh_token)
    except TokenError as exc:
        raise HTTPException(401, str(exc)) from None
    row = db.get(RefreshToken, jti)
    if row is None or row.revoked_at is not None or row.user_id != user_id:
        raise HTTPException(401, "refresh token revoked")
    row.revoked_at = time.time()
    user = db.get(User, user_id)
    if user is None or not user.active:
        raise HTTPException(401, "user disabled")
    return _pair(p, db, user)


@router.post("/auth/logout")
def logout(body: RefreshIn, p: Platform = Depends(platform), db: Session = Depends(db_session)) -> dict:
    try:
        _, jti = decode_refresh(p.keys, body.refresh_token)
    except TokenError as exc:
        raise HTTPException(401, str(exc)) from None
    row = db.get(RefreshToken, jti)
    if row is not None and row.revoked_at is None:
        row.revoked_at = time.time()
        db.commit()
    return {"ok": True}


@router.get("/me")
def me(user: User = Depends(current_user), db: Session = Depends(db_session)) -> dict:
    return {
        "id": user.id,
        "username": user.username,
        "role": user.role,
        "default_account": user.default_account,
        "accounts": tenancy.user_accounts(db, user),
    }


def create_opaque(db: Session, user: User, kind: str, name: str, ttl_s: float | None) -> tuple[str, ApiToken]:
    secret = new_opaque_token(PERSONAL_PREFIX if kind == "personal" else SESSION_PREFIX)
    now = time.time()
    row = ApiToken(
        user_id=user.id,
        kind=kind,
        name=name,
        token_hash=hash_token(secret),
        prefix=secret[:10],
        created_at=now,
        expires_at=now + ttl_s if ttl_s else None,
    )
    db.add(row)
    db.commit()
    return secret, row


def _token_view(t: ApiToken) -> dict:
    return {
        "id": t.id,
        "name": t.name,
        "prefix": t.prefix,
        "created_at": t.created_at,
        "expires_at": t.expires_at,
        "last_used_at": t.last_used_at,
        "revoked": t.revoked_at is not None,
    }


@router.post("/tokens", status_code=201)
def create_token(body: TokenIn, user: User = Depends(current_user), db: Session = Depends(db_session)) -> dict:
    """The secret is shown once, here."""
    ttl = body.expires_in_days * 86400 if body.expires_in_days else None
    secret, row = create_opaque(db, user, "personal", body.name, ttl)
    return {**_token_view(row), "token": secret}


@router.get("/tokens")
def list_tokens(user: User = Depends(current_user), db: Session = Depends(db_session)) -> list[dict]:
    rows = db.scalars(
        select(ApiToken).where(ApiToken.user_id == user.id, ApiToken.kind == "personal").order_by(ApiToken.id)
    )
    return [_token_view(t) for t in rows]


@router.delete("/tokens/{token_id}")
def revoke_token(token_id: RowId, user: User = Depends(current_user), db: Session = Depends(db_session)) -> dict:
    row = db.get(ApiToken, token_id)
    if row is None or row.user_id != user.id:
        raise HTTPException(404, "no such token")
    row.revoked_at = row.revoked_at or time.time()
    db.commit()
    return _token_view(row)
