"""Which accounts a user belongs to: a query on the stored tables that the server (``caldera.server.tenancy``) and
domain packages (``caldera.images``) both ask, so it lives below both."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from caldera.db.models import Account, Membership, User


def user_accounts(db: Session, user: User) -> list[str]:
    rows = db.scalars(
        select(Account.name)
        .join(Membership, Membership.account_id == Account.id)
        .where(Membership.user_id == user.id)
        .order_by(Account.name)
    )
    return list(rows)


def is_member(db: Session, user: User, account: str) -> bool:
    return account in user_accounts(db, user)
