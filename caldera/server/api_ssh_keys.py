"""My SSH public keys: add (checked by core.ssh_keys), list, delete. They reach my own jobs as an
authorized_keys file (``user_keys.authorized_keys``). Like personal API tokens, each user sees only their own;
another's key id is a 404."""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from caldera.core import ssh_keys
from caldera.db.models import SshKey, User
from caldera.server.deps import current_user, db_session
from caldera.server.errors import Conflict, Invalid, NotFound
from caldera.server.params import RowId
from caldera.server.user_keys import user_keys

router = APIRouter(prefix="/api/v1", tags=["auth"])
MAX_KEYS_PER_USER = 50


class SshKeyIn(BaseModel):
    public_key: str = Field(..., max_length=ssh_keys.MAX_KEY_CHARS, description="one line of an id_*.pub file")
    name: str = Field("", max_length=ssh_keys.MAX_NAME_CHARS, description="empty: the key's comment")


class DuplicateKey(Invalid):
    status = 409


def view(k: SshKey) -> dict:
    return {
        "id": k.id,
        "name": k.name,
        "key_type": k.key_type,
        "fingerprint": k.fingerprint,
        "public_key": k.public_key,
        "created_at": k.created_at,
    }


def _duplicate(db: Session, user: User, fingerprint: str) -> DuplicateKey | None:
    same = db.scalar(select(SshKey).where(SshKey.user_id == user.id, SshKey.fingerprint == fingerprint))
    return DuplicateKey("public_key", f"you already added this key, as {same.name!r}") if same else None


@router.post("/ssh-keys", status_code=201)
def add_key(body: SshKeyIn, user: User = Depends(current_user), db: Session = Depends(db_session)) -> dict:
    try:
        key = ssh_keys.parse(body.public_key)
    except ssh_keys.SshKeyError as exc:
        raise Invalid("public_key", str(exc)) from None
    try:
        name = ssh_keys.key_name(body.name, key)
    except ssh_keys.SshKeyError as exc:
        raise Invalid("name", str(exc)) from None
    duplicate = _duplicate(db, user, key.fingerprint)
    if duplicate:
        raise duplicate
    count = db.scalar(select(func.count()).select_from(SshKey).where(SshKey.user_id == user.id)) or 0
    if count >= MAX_KEYS_PER_USER:
        raise Conflict(f"you have {count} SSH keys, the most one may keep; delete some first")
    row = SshKey(
        user_id=user.id,
        name=name,
        key_type=key.key_type,
        public_key=key.line,
        fingerprint=key.fingerprint,
        created_at=time.time(),
    )
    db.add(row)
    try:
        db.commit()
    except IntegrityError:  # the same key added twice at once: the unique (user, fingerprint) refused the second
        db.rollback()
        raise _duplicate(db, user, key.fingerprint) or Conflict("the key could not be added; try again") from None
    return view(row)


@router.get("/ssh-keys")
def list_keys(user: User = Depends(current_user), db: Session = Depends(db_session)) -> list[dict]:
    return [view(k) for k in user_keys(db, user.id)]


@router.delete("/ssh-keys/{key_id}")
def delete_key(key_id: RowId, user: User = Depends(current_user), db: Session = Depends(db_session)) -> dict:
    row = db.get(SshKey, key_id)
    if row is None or row.user_id != user.id:
        raise NotFound("no such SSH key")
    out = view(row)
    db.delete(row)
    db.commit()
    return out
