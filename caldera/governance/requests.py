"""Extend and lock requests: who may ask, who may decide, what an approval changes. A user asks about their own
job; an admin of the job's account or a platform admin decides, and nobody but a platform admin decides their own
request."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from caldera.core.tenancy import Role
from caldera.db.models import Account, GovernanceRequest, Job, Membership, User

EXTEND, LOCK = "extend", "lock"
KINDS = (EXTEND, LOCK)
PENDING, APPROVED, DECLINED, EXPIRED = "pending", "approved", "declined", "expired"
MAX_SECONDS = 30 * 86400  # the longest extension or lock one request may ask for
MAX_REASON_CHARS = 500


def is_account_admin(db: Session, user: User, account: str) -> bool:
    row = db.scalar(
        select(Membership.admin)
        .join(Account, Account.id == Membership.account_id)
        .where(Account.name == account, Membership.user_id == user.id)
    )
    return bool(row)


def admin_accounts(db: Session, user: User) -> list[str]:
    rows = db.scalars(
        select(Account.name)
        .join(Membership, Membership.account_id == Account.id)
        .where(Membership.user_id == user.id, Membership.admin)
    )
    return list(rows)


def may_decide(db: Session, user: User, req: GovernanceRequest, job: Job) -> bool:
    if user.role == Role.ADMIN.value:
        return True
    return req.user_id != user.id and is_account_admin(db, user, job.account)


def _account_admin_ids(account: str):
    return (
        select(Membership.user_id)
        .join(Account, Account.id == Membership.account_id)
        .where(Account.name == account, Membership.admin)
    )


def account_admins(db: Session, account: str) -> list[User]:
    """The active admins of ``account`` (not the platform admins)."""
    return list(db.scalars(select(User).where(User.active, User.id.in_(_account_admin_ids(account)))))


def deciders(db: Session, job: Job) -> list[User]:
    """Everyone who may decide a request about ``job``: its account's admins and the platform admins."""
    q = select(User).where(User.active, (User.role == Role.ADMIN.value) | User.id.in_(_account_admin_ids(job.account)))
    return [u for u in db.scalars(q) if u.id != job.user_id or u.role == Role.ADMIN.value]


def visible_requests(db: Session, user: User, states: list[str] | None = None, limit: int = 200) -> list:
    """(request, job) pairs: my own, and those I may decide."""
    q = select(GovernanceRequest, Job).join(Job, Job.id == GovernanceRequest.job_id)
    if user.role != Role.ADMIN.value:
        mine = GovernanceRequest.user_id == user.id
        q = q.where(mine | Job.account.in_(admin_accounts(db, user)))
    if states:
        q = q.where(GovernanceRequest.state.in_(states))
    return list(db.execute(q.order_by(GovernanceRequest.id.desc()).limit(limit)).all())
