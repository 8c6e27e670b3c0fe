"""Users, accounts, memberships and queues: the rules, independent of HTTP."""

from __future__ import annotations

import secrets
import time

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from caldera.core.tenancy import QueueConfig, Role
from caldera.db.membership import is_member, user_accounts  # noqa: F401 - the server's callers ask tenancy
from caldera.db.models import Account, ApiToken, Membership, Queue, RefreshToken, User
from caldera.server.errors import Conflict, Invalid, NotFound
from caldera.server.security import hash_password

DEFAULT_ACCOUNT = "default"


def usernames(db: Session) -> dict[int, str]:
    """Every user's name by id: what a view of many rows (jobs, images, requests) names their owners with."""
    return dict(db.execute(select(User.id, User.username)).all())


def username(db: Session, user_id: int) -> str | None:
    """One user's name: what a view of one row names its owner with."""
    return db.scalar(select(User.username).where(User.id == user_id))


def get_user(db: Session, username: str) -> User:
    user = db.scalar(select(User).where(User.username == username))
    if user is None:
        raise NotFound(f"no user {username!r}")
    return user


def get_account(db: Session, name: str) -> Account:
    acc = db.scalar(select(Account).where(Account.name == name))
    if acc is None:
        raise NotFound(f"no account {name!r}")
    return acc


def create_account(db: Session, name: str, description: str = "") -> Account:
    if db.scalar(select(Account).where(Account.name == name)) is not None:
        raise Conflict(f"account {name!r} exists")
    acc = Account(name=name, description=description, created_at=time.time())
    db.add(acc)
    db.flush()
    # every account gets a default queue of its own name, unlimited until an admin sets quotas
    if db.scalar(select(Queue).where(Queue.name == name)) is None:
        db.add(
            Queue(name=name, account_id=acc.id, config=_stored(QueueConfig(name=name, account=name)), is_default=True)
        )
    return acc


def create_user(
    db: Session, username: str, password: str, role: Role = Role.USER, accounts: list[str] | None = None
) -> User:
    if db.scalar(select(User).where(User.username == username)) is not None:
        raise Conflict(f"user {username!r} exists")
    check_password(password)
    names = accounts or [DEFAULT_ACCOUNT]
    user = User(
        username=username,
        password_hash=hash_password(password),
        role=role.value,
        default_account=names[0],
        created_at=time.time(),
    )
    db.add(user)
    db.flush()
    for name in names:
        add_member(db, name, user)
    return user


def check_password(password: str) -> None:
    if len(password) < 8:
        raise Invalid("password", "must be at least 8 characters")


def set_password(db: Session, user: User, password: str) -> None:
    """A new password ends every login made with the old one: refresh tokens and browser sessions are revoked, and
    access tokens and lab cookies issued before now stop counting (``credentials_changed_at``). Personal API
    tokens stay: their owner lists and revokes them."""
    check_password(password)
    now = time.time()
    user.password_hash = hash_password(password)
    user.credentials_changed_at = now
    db.execute(
        update(RefreshToken)
        .where(RefreshToken.user_id == user.id, RefreshToken.revoked_at.is_(None))
        .values(revoked_at=now)
    )
    db.execute(
        update(ApiToken)
        .where(ApiToken.user_id == user.id, ApiToken.kind == "session", ApiToken.revoked_at.is_(None))
        .values(revoked_at=now)
    )


def add_member(db: Session, account: str, user: User) -> None:
    acc = get_account(db, account)
    exists = db.scalar(select(Membership).where(Membership.account_id == acc.id, Membership.user_id == user.id))
    if exists is None:
        db.add(Membership(account_id=acc.id, user_id=user.id))
    if user.default_account is None:
        user.default_account = account


def remove_member(db: Session, account: str, user: User) -> None:
    acc = get_account(db, account)
    row = db.scalar(select(Membership).where(Membership.account_id == acc.id, Membership.user_id == user.id))
    if row is None:
        raise NotFound(f"{user.username} is not a member of {account}")
    db.delete(row)
    if user.default_account == account:
        user.default_account = None


def _stored(cfg: QueueConfig) -> dict:
    return cfg.model_dump(mode="json", exclude={"name", "account"})


def queue_config(q: Queue, account: str) -> QueueConfig:
    return QueueConfig(name=q.name, account=account, **q.config)


def all_queue_configs(db: Session) -> dict[str, QueueConfig]:
    rows = db.execute(select(Queue, Account.name).join(Account, Account.id == Queue.account_id)).all()
    return {q.name: queue_config(q, acc) for q, acc in rows}


def visible_queue_configs(db: Session, user: User) -> list[QueueConfig]:
    """The queues a user may see: every queue for an admin, else those of the user's accounts."""
    configs = all_queue_configs(db).values()
    if user.role == Role.ADMIN.value:
        return list(configs)
    mine = set(user_accounts(db, user))
    return [cfg for cfg in configs if cfg.account in mine]


def get_queue(db: Session, name: str) -> tuple[Queue, str]:
    row = db.execute(
        select(Queue, Account.name).join(Account, Account.id == Queue.account_id).where(Queue.name == name)
    ).first()
    if row is None:
        raise NotFound(f"no queue {name!r}")
    return row[0], row[1]


def default_queue(db: Session, account: str) -> str:
    acc = get_account(db, account)
    q = db.scalar(select(Queue).where(Queue.account_id == acc.id).order_by(Queue.is_default.desc(), Queue.id))
    if q is None:
        raise NotFound(f"account {account!r} has no queue")
    return q.name


def put_queue(db: Session, cfg: QueueConfig) -> Queue:
    acc = get_account(db, cfg.account)
    q = db.scalar(select(Queue).where(Queue.name == cfg.name))
    if q is None:
        q = Queue(name=cfg.name, account_id=acc.id, config=_stored(cfg), is_default=False)
        db.add(q)
    else:
        if q.account_id != acc.id:
            raise Conflict(f"queue {cfg.name!r} belongs to another account")
        q.config = _stored(cfg)
    db.flush()
    return q


def bootstrap(db: Session, password: str | None = None) -> tuple[str, str] | None:
    """On a fresh database: the default account and the first admin. Returns (username, password) once."""
    if db.scalar(select(Account).where(Account.name == DEFAULT_ACCOUNT)) is None:
        create_account(db, DEFAULT_ACCOUNT, "everyone's account until an admin creates others")
    if db.scalar(select(User).limit(1)) is not None:
        return None
    password = password or secrets.token_urlsafe(12)
    create_user(db, "admin", password, Role.ADMIN)
    return "admin", password
