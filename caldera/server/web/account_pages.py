"""My accounts (switch the default one: where jobs go when they name none, and what the new-job form starts
with) and my personal API tokens (for the CLI and scripts): create (the secret is shown once), list, revoke."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Form, HTTPException, Request
from fastapi.responses import RedirectResponse
from sqlalchemy.orm import Session

from caldera.db.models import User
from caldera.server import api_auth, tenancy
from caldera.server.deps import db_session
from caldera.server.web import api_call, overview
from caldera.server.web.render import page
from caldera.server.web.session import PageNotFound, page_user

router = APIRouter(include_in_schema=False)


def _tokens_page(request: Request, user: User, db: Session, created=None, errors=(), status=200):
    tokens = api_auth.list_tokens(user=user, db=db)
    return page(request, "tokens.html", status=status, user=user, tokens=tokens, created=created, errors=list(errors))


@router.get("/tokens")
def tokens(request: Request, user: User = Depends(page_user), db: Session = Depends(db_session)):
    return _tokens_page(request, user, db)


@router.post("/tokens")
def create_token(
    request: Request,
    name: str = Form("", max_length=128),
    expires_in_days: str = Form("", max_length=8),
    user: User = Depends(page_user),
    db: Session = Depends(db_session),
):
    days = expires_in_days.strip() or None
    created, errors = api_call.call(
        db, lambda: api_auth.create_token(body=api_auth.TokenIn(name=name, expires_in_days=days), user=user, db=db)
    )
    if errors:
        return _tokens_page(request, user, db, errors=errors, status=400)
    return _tokens_page(request, user, db, created=created, status=201)


@router.post("/tokens/{token_id}/revoke")
def revoke_token(token_id: int, user: User = Depends(page_user), db: Session = Depends(db_session)):
    try:
        api_auth.revoke_token(token_id=token_id, user=user, db=db)
    except HTTPException:  # not the user's: the same 404 as the API's
        raise PageNotFound() from None
    return RedirectResponse("/tokens", 303)


def _accounts_page(request: Request, user: User, db: Session, errors=(), status=200):
    queues: dict[str, list[str]] = {}
    for q in overview.my_queues(db, user):
        queues.setdefault(q["account"], []).append(q["queue"])
    accounts = [{"name": a, "queues": queues.get(a, [])} for a in tenancy.user_accounts(db, user)]
    return page(request, "accounts.html", status=status, user=user, accounts=accounts, errors=list(errors))


@router.get("/accounts")
def my_accounts(request: Request, user: User = Depends(page_user), db: Session = Depends(db_session)):
    return _accounts_page(request, user, db)


@router.post("/accounts/default")
def switch_account(
    request: Request,
    account: str = Form("", max_length=64),
    user: User = Depends(page_user),
    db: Session = Depends(db_session),
):
    """Only to an account one is a member of: the same membership rule as a job's submission (jobs.submit)."""
    if not tenancy.is_member(db, user, account):
        reason = f"you are not a member of account {account!r}"
        return _accounts_page(request, user, db, [{"field": "account", "reason": reason}], 400)
    user.default_account = account
    db.commit()
    return RedirectResponse("/accounts", 303)
