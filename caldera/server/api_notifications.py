"""My notifications: the portal's list with its unread count and each outside delivery's state, marking read,
and my settings (address, webhook, language, channels per event). Each user sees only their own."""

from __future__ import annotations

import re
import time
from typing import Literal

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field, field_validator
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from caldera.core.notify_events import NotifyEvent
from caldera.db.models import Notification, NotificationSettings, OutboxMessage, User
from caldera.notify import events
from caldera.notify.outbox import settings_of
from caldera.notify.webhook import MAX_URL_CHARS, valid_url
from caldera.server.deps import current_user, db_session
from caldera.server.errors import NotFound
from caldera.server.params import RowId
from caldera.server.web.i18n import LANGUAGES

router = APIRouter(prefix="/api/v1", tags=["notifications"])
Channel = Literal["portal", "email", "webhook"]
ADDRESS = re.compile(r"[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*")


class SettingsIn(BaseModel):
    email: str = Field("", max_length=254)
    webhook_url: str = Field("", max_length=MAX_URL_CHARS)
    language: str = Field("en", max_length=8)
    channels: dict[NotifyEvent, list[Channel]] = Field(default_factory=dict, max_length=len(events.EVENTS))

    @field_validator("webhook_url")
    @classmethod
    def _http(cls, url: str) -> str:
        if url and not valid_url(url):
            raise ValueError("an http(s) URL")
        return url

    @field_validator("email")
    @classmethod
    def _address(cls, address: str) -> str:
        if address and not ADDRESS.fullmatch(address):
            raise ValueError("an e-mail address, name@domain")
        return address

    @field_validator("language")
    @classmethod
    def _known(cls, lang: str) -> str:
        if lang not in LANGUAGES:
            raise ValueError(f"one of {', '.join(LANGUAGES)}")
        return lang


def settings_view(prefs: NotificationSettings) -> dict:
    chosen = prefs.channels or {}
    return {
        "email": prefs.email,
        "webhook_url": prefs.webhook_url,
        "language": prefs.language,
        "channels": {e: chosen.get(e, events.DEFAULT_CHANNELS[e]) for e in events.EVENTS},
    }


def unread_count(db: Session, user_id: int) -> int:
    unread = (Notification.user_id == user_id, Notification.in_portal, Notification.read_at.is_(None))
    return db.scalar(select(func.count()).select_from(Notification).where(*unread)) or 0


def listing(db: Session, user_id: int, limit: int) -> dict:
    notes = db.scalars(
        select(Notification)
        .where(Notification.user_id == user_id, Notification.in_portal)
        .order_by(Notification.id.desc())
        .limit(limit)
    ).all()
    ids = [n.id for n in notes]
    deliveries: dict[int, list[dict]] = {i: [] for i in ids}
    for row in db.scalars(select(OutboxMessage).where(OutboxMessage.notification_id.in_(ids))):
        deliveries[row.notification_id].append(
            {"channel": row.channel, "state": row.state, "attempts": row.attempts, "last_error": row.last_error}
        )
    items = [
        {
            "id": n.id,
            "event": n.event,
            "job_id": n.job_id,
            "subject": n.subject,
            "body": n.body,
            "created_at": n.created_at,
            "read": n.read_at is not None,
            "deliveries": deliveries[n.id],
        }
        for n in notes
    ]
    return {"unread": unread_count(db, user_id), "items": items}


@router.get("/notifications")
def list_notifications(
    limit: int = Query(50, ge=1, le=500), user: User = Depends(current_user), db: Session = Depends(db_session)
) -> dict:
    return listing(db, user.id, limit)


@router.post("/notifications/{note_id}/read")
def mark_read(note_id: RowId, user: User = Depends(current_user), db: Session = Depends(db_session)) -> dict:
    note = db.get(Notification, note_id)
    if note is None or note.user_id != user.id:
        raise NotFound("no such notification")
    note.read_at = note.read_at or time.time()
    db.commit()
    return {"unread": unread_count(db, user.id)}


@router.post("/notifications/read-all")
def mark_all_read(user: User = Depends(current_user), db: Session = Depends(db_session)) -> dict:
    db.execute(
        update(Notification)
        .where(Notification.user_id == user.id, Notification.read_at.is_(None))
        .values(read_at=time.time())
    )
    db.commit()
    return {"unread": 0}


@router.get("/notifications/settings")
def get_settings(user: User = Depends(current_user), db: Session = Depends(db_session)) -> dict:
    return settings_view(settings_of(db, user.id))


@router.put("/notifications/settings")
def put_settings(body: SettingsIn, user: User = Depends(current_user), db: Session = Depends(db_session)) -> dict:
    prefs = db.get(NotificationSettings, user.id) or NotificationSettings(user_id=user.id)
    prefs.email, prefs.webhook_url, prefs.language = body.email, body.webhook_url, body.language
    prefs.channels = {e: sorted(set(c)) for e, c in body.channels.items()}
    db.merge(prefs)
    db.commit()
    return settings_view(prefs)
