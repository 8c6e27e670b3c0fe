"""Admin pages for accounts and their members: create an account, add and remove members, through the API's own
route functions (the same rules, the same audit entries)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import RedirectResponse
from sqlalchemy import select
from sqlalchemy.orm import Session

from caldera.db.models import Account, Membership, User
from caldera.server import api_admin
from caldera.server.deps import db_session
from caldera.server.web import api_call
from caldera.server.web.render import page
from caldera.server.web.session import page_admin

router = APIRouter(prefix="/admin/accounts", include_in_schema=False)


def _members(db: Session) -> dict[str, list[str]]:
    rows = db.execute(
        select(Account.name, User.username)
        .join(Membership, Membership.account_id == Account.id)
        .join(User, User.id == Membership.user_id)
        .order_by(User.username)
    )
    out: dict[str, list[str]] = {}
    for account, username in rows:
        out.setdefault(account, []).append(username)
    return out


def _accounts_page(request: Request, admin: User, db: Session, errors=(), typed=None, status: int = 200):
    accounts = db.scalars(select(Account).order_by(Account.name))
    return page(
        request, "admin_accounts.html", status=status, user=admin, accounts=list(accounts), members=_members(db),
        usernames=list(db.scalars(select(User.username).order_by(User.username))), errors=list(errors),
        typed=typed or {},
    )  # fmt: skip


@router.get("")
def accounts(request: Request, admin: User = Depends(page_admin), db: Session = Depends(db_session)):
    return _accounts_page(request, admin, db)


def _after(request: Request, admin: User, db: Session, errors: list, typed: dict | None = None):
    if errors:
        return _accounts_page(request, admin, db, errors, typed, 400)
    return RedirectResponse("/admin/accounts", 303)


@router.post("")
def create_account(
    request: Request,
    name: str = Form("", max_length=64),
    description: str = Form("", max_length=4096),
    admin: User = Depends(page_admin),
    db: Session = Depends(db_session),
):
    body = lambda: api_admin.AccountIn(name=name, description=description)  # noqa: E731 - validated inside call
    _, errors = api_call.call(db, lambda: api_admin.create_account(body=body(), _=admin, db=db))
    return _after(request, admin, db, errors, {"name": name, "description": description})


@router.post("/{name}/members")
def add_member(
    request: Request,
    name: str,
    username: str = Form("", max_length=64),
    admin: User = Depends(page_admin),
    db: Session = Depends(db_session),
):
    _, errors = api_call.call(
        db, lambda: api_admin.add_member(name=name[:64], body=api_admin.MemberIn(username=username), _=admin, db=db)
    )
    return _after(request, admin, db, errors)


@router.post("/{name}/members/{username}/remove")
def remove_member(
    request: Request, name: str, username: str, admin: User = Depends(page_admin), db: Session = Depends(db_session)
):
    _, errors = api_call.call(db, api_admin.remove_member, name=name[:64], username=username[:64], _=admin, db=db)
    return _after(request, admin, db, errors)
