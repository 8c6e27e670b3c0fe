"""A user's stored SSH public keys, as the API lists them and as the loop hands them to that user's jobs."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from caldera.db.models import SshKey


def user_keys(db: Session, user_id: int) -> list[SshKey]:
    return list(db.scalars(select(SshKey).where(SshKey.user_id == user_id).order_by(SshKey.id)))


def authorized_keys(db: Session, user_id: int) -> str:
    """The user's keys as an authorized_keys file ("" when they have none)."""
    return "".join(k.public_key + "\n" for k in user_keys(db, user_id))
