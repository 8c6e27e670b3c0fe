"""Pages from Jinja2 templates: the language, the CSRF token and a strict Content-Security-Policy on each."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse, JSONResponse
from jinja2 import Environment, FileSystemLoader, select_autoescape

from caldera.server import csrf, jobs
from caldera.server.web import i18n, listing
from caldera.server.web.reason_text import Say

TEMPLATES = Path(__file__).parent / "templates"
STATIC = Path(__file__).parent / "static"

env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(default=True))


def age(ts: float | None, now: float | None = None) -> str:
    """Seconds, minutes, hours or days since ``ts``: what a job list needs at a glance."""
    if not ts:
        return "-"
    s = max(0, int((now or time.time()) - ts))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s // size}{unit}"
    return f"{s}s"


def clock(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def size(n: int | None) -> str:
    """Bytes as people read them: 0 B, 900 B, 1.5 KiB ... 2.0 TiB."""
    value = float(n or 0)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return ""


env.filters["size"] = size
env.filters["age"] = age
env.filters["clock"] = clock
env.filters["gpus"] = jobs.total_gpus
env.globals["list_sizes"] = listing.SIZES


def _csp(request: Request, style_nonce: str = "") -> str:
    # forms may lead to a lab's origin: logging in with next=/jobs/<id>/lab/ ends there through redirects
    lab = request.app.state.platform.settings.lab_url("*")
    styles = f"'self' 'nonce-{style_nonce}'" if style_nonce else "'self'"
    return (
        f"default-src 'self'; script-src 'self'; style-src {styles}; img-src 'self' data:; connect-src 'self'; "
        f"frame-ancestors 'none'; base-uri 'none'; object-src 'none'; form-action 'self' {lab}"
    )


def checked(request: Request, errors: dict[str, list]) -> JSONResponse:
    """A form's errors by field, as a page would show them (the reader's language): what a form's script shows
    as one types (static/form_check.js)."""
    say = Say(i18n.translations(i18n.choose(request)).gettext)
    return JSONResponse({"errors": say.errors(errors)}, headers={"Cache-Control": "no-store"})


def page(request: Request, template: str, status: int = 200, style_nonce: str = "", **ctx: Any) -> HTMLResponse:
    """``style_nonce``: the page's scripts make <style> elements of their own (xterm.js) and mark them with it."""
    lang = i18n.choose(request)
    tr = i18n.translations(lang)
    say = Say(tr.gettext)
    if "errors" in ctx:  # the API's reasons in the page's language
        ctx["errors"] = say.errors(ctx["errors"])
    html = env.get_template(template).render(
        request=request,
        _=tr.gettext,
        say=say,
        lang=lang,
        languages=i18n.LANGUAGES,
        csrf_token=csrf.csrf_token(request),
        why_waiting=request.app.state.platform.queue_positions.shown,  # a job's reasons with its place in the queue
        csrf_field=csrf.CSRF_FIELD,
        style_nonce=style_nonce,
        **ctx,
    )
    resp = HTMLResponse(html, status_code=status)
    resp.headers["Content-Security-Policy"] = _csp(request, style_nonce)
    resp.headers["X-Content-Type-Options"] = "nosniff"
    resp.headers["Referrer-Policy"] = "same-origin"
    resp.headers["Cache-Control"] = "no-store"
    return resp
