"""Recording a notification and its outside deliveries, and delivering them.

``notify`` runs inside the caller's transaction (the loop's, a request's): it only writes rows, so a mail server
that is down never slows the loop, and a notification is never lost to a crash between deciding and sending.
``dispatch`` runs on its own (a thread of the server), sends what is due and reschedules failures with doubling
delays until ``notify_max_attempts``, after which the row is ``failed``; every row's state is shown to its user."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from caldera.config import Settings
from caldera.db.models import Notification, NotificationSettings, OutboxMessage, User
from caldera.notify import events
from caldera.notify.base import DeliveryError, Message, Notifier

MAX_RETRY_DELAY_S = 3600.0
MAX_ERROR_CHARS = 500


def settings_of(db: Session, user_id: int) -> NotificationSettings:
    """The user's notification settings; defaults (not stored) when they never chose."""
    found = db.get(NotificationSettings, user_id)
    return found or NotificationSettings(user_id=user_id, email="", webhook_url="", language="en", channels={})


def notify(
    db: Session,
    user_id: int,
    event: str,
    params: Mapping[str, Any],
    translate: Any,
    job_spec: Mapping[str, Any] | None = None,
    job_id: str | None = None,
    now: float | None = None,
) -> Notification | None:
    """Record ``event`` for the user on the channels they chose; ``translate(lang)`` gives that language's gettext.
    None when they chose no channel for it."""
    now = time.time() if now is None else now
    prefs = settings_of(db, user_id)
    channels = events.channels_for(event, prefs.channels or {}, job_spec)
    targets = {events.EMAIL: prefs.email, events.WEBHOOK: prefs.webhook_url}
    outside = [(c, targets[c]) for c in channels if c in targets and targets[c]]
    if not outside and events.PORTAL not in channels:
        return None
    subject, body = events.render(event, params, translate(prefs.language))
    note = Notification(
        user_id=user_id,
        event=event,
        job_id=job_id,
        subject=subject,
        body=body,
        created_at=now,
        in_portal=events.PORTAL in channels,
    )
    db.add(note)
    db.flush()
    for channel, target in outside:
        db.add(
            OutboxMessage(
                notification_id=note.id,
                channel=channel,
                target=target,
                state="pending",
                attempts=0,
                next_try_at=now,
                last_error="",
            )
        )
    return note


def retry_delay(settings: Settings, attempts: int) -> float:
    return min(settings.notify_retry_base_s * 2 ** (attempts - 1), MAX_RETRY_DELAY_S)


def dispatch(
    sessions: sessionmaker, notifiers: Mapping[str, Notifier], settings: Settings, now: float | None = None
) -> int:
    """Try every delivery that is due once; the number sent. Each row is claimed, sent and recorded in its own
    transaction so a slow server delays only its own row."""
    now = time.time() if now is None else now
    with sessions() as db:
        due = db.scalars(
            select(OutboxMessage.id)
            .where(OutboxMessage.state == "pending", OutboxMessage.next_try_at <= now)
            .order_by(OutboxMessage.next_try_at)
            .limit(100)
        ).all()
    sent = 0
    for row_id in due:
        with sessions() as db:
            row = db.get(OutboxMessage, row_id)
            if row is None or row.state != "pending":
                continue
            note = db.get(Notification, row.notification_id)
            user = db.get(User, note.user_id) if note else None
            if note is None or user is None:
                continue
            message = Message(user.username, note.event, note.subject, note.body, note.job_id, note.created_at)
            notifier = notifiers.get(row.channel)
            row.attempts += 1
            try:
                if notifier is None:
                    raise DeliveryError(f"no notifier for channel {row.channel!r} is installed")
                notifier.deliver(message, row.target)
            except DeliveryError as exc:
                row.last_error = str(exc)[:MAX_ERROR_CHARS]
                if row.attempts >= settings.notify_max_attempts:
                    row.state = "failed"
                else:
                    row.next_try_at = time.time() + retry_delay(settings, row.attempts)
            else:
                row.state, row.sent_at, row.last_error = "sent", time.time(), ""
                sent += 1
            db.commit()
    return sent
