"""My notifications page: the list (newest first, each outside delivery's state), mark all read, and my settings
(address, webhook, language, and per event which channels), a form over the notifications API."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import RedirectResponse
from sqlalchemy.orm import Session

from caldera.core.notify_events import EVENTS
from caldera.db.models import User
from caldera.notify.events import CHANNELS
from caldera.server import api_notifications
from caldera.server.deps import db_session
from caldera.server.web import api_call
from caldera.server.web.render import page
from caldera.server.web.session import page_user

router = APIRouter(include_in_schema=False)
MAX_FORM_FIELDS = 64


def _page(request: Request, user: User, db: Session, errors=(), status=200):
    return page(
        request, "notifications.html", status=status, user=user,
        listing=api_notifications.listing(db, user.id, 100),
        prefs=api_notifications.get_settings(user=user, db=db),
        events=EVENTS, channels=CHANNELS, errors=list(errors),
    )  # fmt: skip


@router.get("/notifications")
def notifications(request: Request, user: User = Depends(page_user), db: Session = Depends(db_session)):
    return _page(request, user, db)


@router.get("/partials/unread")
def unread(request: Request, user: User = Depends(page_user), db: Session = Depends(db_session)):
    """The header's count of my unread notifications, loaded by HTMX after the page (no page waits for it)."""
    return page(request, "_unread.html", unread=api_notifications.unread_count(db, user.id))


@router.post("/notifications/read-all")
def read_all(user: User = Depends(page_user), db: Session = Depends(db_session)):
    api_notifications.mark_all_read(user=user, db=db)
    return RedirectResponse("/notifications", 303)


@router.post("/notifications/settings")
async def save_settings(request: Request, user: User = Depends(page_user), db: Session = Depends(db_session)):
    form = await request.form(max_fields=MAX_FORM_FIELDS)
    chosen = {e: [c for c in CHANNELS if form.get(f"{e}.{c}") == "on"] for e in EVENTS}
    _, errors = api_call.call(
        db,
        lambda: api_notifications.put_settings(
            body=api_notifications.SettingsIn(
                email=str(form.get("email", "")),
                webhook_url=str(form.get("webhook_url", "")),
                language=str(form.get("language", "en")),
                channels=chosen,
            ),
            user=user,
            db=db,
        ),
    )
    if errors:
        return _page(request, user, db, errors=errors, status=400)
    return RedirectResponse("/notifications", 303)
