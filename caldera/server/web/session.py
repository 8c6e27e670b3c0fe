"""Who is looking at a page: the browser session cookie (or a bearer token), the same check as the API's."""

from __future__ import annotations

from urllib.parse import urlencode

from fastapi import Depends, HTTPException, Request
from sqlalchemy.orm import Session

from caldera.core.tenancy import Role
from caldera.db.models import User
from caldera.server.deps import db_session, platform, presented_token, user_for_token
from caldera.server.platform import Platform


class LoginRequired(Exception):
    def __init__(self, next_path: str):
        self.next_path = next_path


class PageForbidden(Exception):
    pass


class PageNotFound(Exception):
    pass


def login_url(next_path: str) -> str:
    return "/login?" + urlencode({"next": next_path}) if next_path != "/" else "/login"


def page_user(request: Request, p: Platform = Depends(platform), db: Session = Depends(db_session)) -> User:
    token = presented_token(request)
    here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    if not token:
        raise LoginRequired(here)
    try:
        return user_for_token(p, db, token)
    except HTTPException:  # expired or revoked session, disabled user: log in again
        raise LoginRequired(here) from None


def page_admin(user: User = Depends(page_user)) -> User:
    if user.role != Role.ADMIN.value:
        raise PageForbidden()
    return user
