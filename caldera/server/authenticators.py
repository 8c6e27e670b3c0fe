"""Who may log in with a name and password: local accounts by default; a directory (LDAP) or a single-sign-on
provider (OIDC) plugs in as another ``PasswordAuthenticator`` on ``app.state.authenticators``. The login route keeps
its rate limit and its constant-time answer for unknown names whichever one answers. Neither LDAP nor OIDC ships
here: an OIDC login is a redirect flow, which would add a route beside this interface, not replace it."""

from __future__ import annotations

from typing import Protocol

from sqlalchemy import select
from sqlalchemy.orm import Session

from caldera.db.models import User
from caldera.server.security import verify_password


class PasswordAuthenticator(Protocol):
    def authenticate(self, db: Session, username: str, password: str) -> User | None:
        """The platform's user for these credentials (created on first login if the source says so), or None."""
        ...


class LocalAccounts:
    """Users and password hashes in Caldera's own database; a missing or disabled user costs the same hash check."""

    def authenticate(self, db: Session, username: str, password: str) -> User | None:
        user = db.scalar(select(User).where(User.username == username))
        password_hash = user.password_hash if user is not None and user.active else None
        return user if verify_password(password_hash, password) and user is not None else None


def first_match(chain: list[PasswordAuthenticator], db: Session, username: str, password: str) -> User | None:
    for source in chain:
        user = source.authenticate(db, username, password)
        if user is not None and user.active:
            return user
    return None
