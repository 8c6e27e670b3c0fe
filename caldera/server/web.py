"""Server-rendered pages: login (a browser session cookie) and the user's jobs."""

from __future__ import annotations

import html
import time
from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Form, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from sqlalchemy import select
from sqlalchemy.orm import Session

from caldera.db.models import ApiToken
from caldera.server import jobs
from caldera.server.api_auth import authenticate, create_opaque
from caldera.server.deps import SESSION_COOKIE, db_session, platform, presented_token, user_for_token
from caldera.server.platform import Platform
from caldera.server.security import hash_token

router = APIRouter(include_in_schema=False)

_STYLE = """body{font-family:system-ui,sans-serif;margin:2rem auto;max-width:60rem;color:#222}
table{border-collapse:collapse;width:100%}td,th{padding:.3rem .6rem;border-bottom:1px solid #ddd;text-align:left}
.err{color:#b00}input{padding:.3rem;margin:.2rem 0}button{padding:.3rem 1rem}"""


def _page(title: str, body: str) -> HTMLResponse:
    return HTMLResponse(
        f"<!doctype html><html><head><meta charset=utf-8><title>{html.escape(title)} · Caldera"
        f"</title><style>{_STYLE}</style></head><body>{body}</body></html>"
    )


def _safe_next(url: str) -> str:
    # only same-site paths, never //host or a scheme: no open redirect
    return url if url.startswith("/") and not url.startswith("//") else "/"


@router.get("/login")
def login_form(next: str = "/", error: str = "") -> HTMLResponse:
    msg = f"<p class=err>{html.escape(error)}</p>" if error else ""
    return _page(
        "Log in",
        f"""<h1>Caldera</h1>{msg}
<form method=post action="/login"><input type=hidden name=next value="{html.escape(_safe_next(next))}">
<label>User <input name=username autocomplete=username required></label><br>
<label>Password <input name=password type=password autocomplete=current-password required></label><br>
<button type=submit>Log in</button></form>""",
    )


@router.post("/login")
def login(
    request: Request,
    username: str = Form(..., max_length=128),
    password: str = Form(..., max_length=1024),
    next: str = Form("/", max_length=4096),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
):
    try:
        user = authenticate(request, db, username, password)  # rate-limited, same time for unknown names
    except HTTPException as exc:
        return RedirectResponse(f"/login?{urlencode({'next': _safe_next(next), 'error': exc.detail})}", 303)
    secret, _ = create_opaque(db, user, "session", "browser", p.settings.session_ttl_s)
    resp = RedirectResponse(_safe_next(next), 303)
    resp.set_cookie(
        SESSION_COOKIE,
        secret,
        max_age=p.settings.session_ttl_s,
        httponly=True,
        samesite="lax",
        secure=p.settings.url.startswith("https"),
        path="/",
    )
    return resp


@router.post("/logout")
def logout(request: Request, db: Session = Depends(db_session)):
    token = request.cookies.get(SESSION_COOKIE)
    if token:
        row = db.scalar(select(ApiToken).where(ApiToken.token_hash == hash_token(token)))
        if row is not None:
            row.revoked_at = time.time()
            db.commit()
    resp = RedirectResponse("/login", 303)
    resp.delete_cookie(SESSION_COOKIE, path="/")
    return resp


@router.get("/")
def home(request: Request, p: Platform = Depends(platform), db: Session = Depends(db_session)):
    token = presented_token(request)
    try:
        user = user_for_token(p, db, token) if token else None
    except Exception:  # noqa: BLE001 - an expired session simply logs in again
        user = None
    if user is None:
        return RedirectResponse("/login", 303)
    rows = []
    for j in jobs.list_jobs(db, user):
        name = html.escape(j.name)
        if j.kind == "jupyter" and j.state == "Running":
            name = f'<a href="/jobs/{j.id}/lab/">{name}</a>'
        why = "; ".join(r["message"] for r in j.pending_reasons) if j.state == "Queued" else j.message
        rows.append(
            f"<tr><td>{j.id}</td><td>{name}</td><td>{j.kind}</td><td>{j.state}</td>"
            f"<td>{html.escape(why or '')}</td></tr>"
        )
    return _page(
        "Jobs",
        f"""<h1>Jobs of {html.escape(user.username)}</h1>
<form method=post action=/logout><button>Log out</button></form>
<table><tr><th>id</th><th>name</th><th>kind</th><th>state</th><th>why</th></tr>{"".join(rows)}</table>""",
    )
