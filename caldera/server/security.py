"""Passwords, access and refresh tokens, personal API tokens.

Access and refresh tokens are JWTs signed with *different* keys and carry a ``typ`` claim, so a refresh token can
never be accepted where an access token is expected (and vice versa). Personal tokens and browser sessions are
random secrets of which only a SHA-256 is stored.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerifyMismatchError

_hasher = PasswordHasher()

PERSONAL_PREFIX = "cal_"
SESSION_PREFIX = "cals_"


def hash_password(password: str) -> str:
    return _hasher.hash(password)


def verify_password(password_hash: str | None, password: str) -> bool:
    """Always costs one argon2 verification, even without a hash (an unknown user), so the answer time does not
    tell which user names exist."""
    try:
        return _hasher.verify(password_hash or _dummy_hash(), password) and password_hash is not None
    except (VerifyMismatchError, InvalidHashError):
        return False


_DUMMY: list[str] = []


def _dummy_hash() -> str:
    if not _DUMMY:
        _DUMMY.append(_hasher.hash(secrets.token_urlsafe(16)))
    return _DUMMY[0]


def credentials_current(user: Any, issued_at: float) -> bool:
    """The one check of a credential's age: a user's token, session or lab cookie issued before their last password
    change (``users.credentials_changed_at``) no longer counts, nor does anything of a disabled user."""
    return user is not None and user.active and (user.credentials_changed_at or 0.0) <= issued_at


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_opaque_token(prefix: str) -> str:
    return prefix + secrets.token_urlsafe(32)


@dataclass(frozen=True)
class Keys:
    access: str
    refresh: str
    lab: str  # the lab origin's tickets and cookies: a key of their own, so nothing there is a platform token

    @classmethod
    def load_or_create(cls, path: Path) -> Keys:
        """Keys live in a 0600 file in the data directory, created once; a key added by an upgrade is added to
        the file."""
        data = json.loads(path.read_text()) if path.exists() else {}
        missing = [name for name in ("access", "refresh", "lab") if name not in data]
        if missing:
            data.update({name: secrets.token_hex(32) for name in missing})
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                json.dump(data, fh)
            os.replace(tmp, path)
        os.chmod(path, 0o600)
        return cls(data["access"], data["refresh"], data["lab"])


class TokenError(Exception):
    pass


def issue_access(keys: Keys, user_id: int, ttl_s: int) -> str:
    now = time.time()  # not rounded: compared with the moment of a password change
    return jwt.encode(
        {"sub": str(user_id), "typ": "access", "iat": now, "exp": now + ttl_s}, keys.access, algorithm="HS256"
    )


def issue_refresh(keys: Keys, user_id: int, ttl_s: int) -> tuple[str, str, float]:
    now = int(time.time())
    jti = secrets.token_hex(16)
    exp = now + ttl_s
    token = jwt.encode(
        {"sub": str(user_id), "typ": "refresh", "jti": jti, "iat": now, "exp": exp}, keys.refresh, algorithm="HS256"
    )
    return token, jti, float(exp)


def _decode(token: str, key: str, typ: str) -> dict:
    try:
        claims = jwt.decode(token, key, algorithms=["HS256"], options={"require": ["exp", "sub", "typ"]})
    except jwt.ExpiredSignatureError:
        raise TokenError("token expired") from None
    except jwt.PyJWTError:
        raise TokenError("invalid token") from None
    if claims.get("typ") != typ:
        raise TokenError("wrong token type")
    return claims


def decode_access(keys: Keys, token: str) -> tuple[int, float]:
    """The user id and the time the token was issued."""
    claims = _decode(token, keys.access, "access")
    return int(claims["sub"]), float(claims.get("iat", 0))


def decode_refresh(keys: Keys, token: str) -> tuple[int, str]:
    claims = _decode(token, keys.refresh, "refresh")
    return int(claims["sub"]), str(claims.get("jti", ""))


LAB_TICKET = "lab-ticket"  # one use, a minute: carries a login from the platform's origin to the lab's
LAB_SESSION = "lab-session"  # the lab origin's cookie: one job, one user, a few hours


@dataclass(frozen=True)
class LabClaims:
    user_id: int
    job_id: str
    issued_at: float
    jti: str


def issue_lab(keys: Keys, typ: str, user_id: int, job_id: str, ttl_s: float) -> str:
    now = time.time()
    return jwt.encode(
        {"sub": str(user_id), "job": job_id, "typ": typ, "iat": now, "exp": now + ttl_s, "jti": secrets.token_hex(16)},
        keys.lab,
        algorithm="HS256",
    )


def decode_lab(keys: Keys, token: str, typ: str) -> LabClaims:
    claims = _decode(token, keys.lab, typ)
    return LabClaims(
        int(claims["sub"]), str(claims.get("job", "")), float(claims.get("iat", 0)), str(claims.get("jti", ""))
    )
