"""My accounts (switch the default one: where jobs go when they name none, and what the new-job form starts
with), my personal API tokens (for the CLI and scripts): create (the secret is shown once), list, revoke, and on
the same page my SSH public keys (for reaching my jobs): add, list, delete."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Form, HTTPException, Request
from fastapi.responses import RedirectResponse
from sqlalchemy.orm import Session

from caldera.db.models import User
from caldera.server import api_auth, api_ssh_keys, tenancy
from caldera.server.deps import db_session
from caldera.server.errors import NotFound
from caldera.server.params import RowId
from caldera.server.web import api_call, overview
from caldera.server.web.render import page
from caldera.server.web.session import PageNotFound, page_user

router = APIRouter(include_in_schema=False)


def _tokens_page(request: Request, user: User, db: Session, created=None, errors=(), status=200, key_form=None):
    """With ``key_form`` (the SSH key form as typed, when it was refused), ``errors`` are that form's, by field."""
    tokens = api_auth.list_tokens(user=user, db=db)
    keys = api_ssh_keys.list_keys(user=user, db=db)
    shown = _by_field(errors, key_form) if key_form is not None else list(errors)
    return page(
        request, "tokens.html", status=status, user=user, tokens=tokens, keys=keys, created=created, errors=shown,
        key_form=key_form,
    )  # fmt: skip


def _by_field(errors, form: dict[str, str]) -> dict[str, list[str]]:
    """The API's errors next to the form's fields ("name", "public_key"); the rest ("") above the form."""
    out: dict[str, list[str]] = {}
    for e in errors:
        out.setdefault(e["field"] if e["field"] in form else "", []).append(e["reason"])
    return out


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
def revoke_token(token_id: RowId, user: User = Depends(page_user), db: Session = Depends(db_session)):
    try:
        api_auth.revoke_token(token_id=token_id, user=user, db=db)
    except HTTPException:  # not the user's: the same 404 as the API's
        raise PageNotFound() from None
    return RedirectResponse("/tokens", 303)


@router.post("/ssh-keys")
def add_ssh_key(
    request: Request,
    name: str = Form("", max_length=100),
    public_key: str = Form("", max_length=16384),
    user: User = Depends(page_user),
    db: Session = Depends(db_session),
):
    _, errors = api_call.call(
        db, lambda: api_ssh_keys.add_key(body=api_ssh_keys.SshKeyIn(name=name, public_key=public_key), user=user, db=db)
    )
    if errors:
        # a private key pasted by mistake is not sent back into the page
        typed = {"name": name, "public_key": "" if "PRIVATE KEY" in public_key else public_key}
        return _tokens_page(request, user, db, errors=errors, status=400, key_form=typed)
    return RedirectResponse("/tokens#ssh-keys", 303)


@router.post("/ssh-keys/{key_id}/delete")
def delete_ssh_key(key_id: RowId, user: User = Depends(page_user), db: Session = Depends(db_session)):
    try:
        api_ssh_keys.delete_key(key_id=key_id, user=user, db=db)
    except NotFound:  # not the user's: the same 404 as the API's
        raise PageNotFound() from None
    return RedirectResponse("/tokens#ssh-keys", 303)


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
