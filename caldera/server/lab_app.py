"""The labs' server: a second web application, on its own port, that serves nothing but interactive jobs, each
on an origin of its own (``<job>.lab.localhost``, or the host ``CALDERA_LAB_PUBLIC_URL`` makes of the job's id).

A notebook's JavaScript runs here, so nothing here is worth stealing: the platform's pages, API and session cookie
live on another origin, and every other lab on one of its own. A browser arrives at a lab's host with a one-use
ticket for that job that the platform's origin issued after its own login (``lab_entry``), and leaves with a
host-only cookie good for that job, one user and a few hours.
"""

from __future__ import annotations

import asyncio
import threading
import time
from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse, RedirectResponse
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Receive, Scope, Send

from caldera.db.models import User
from caldera.server import headers, jobs, lab_errors, lab_proxy
from caldera.server.errors import CalderaError
from caldera.server.headers import SecurityHeadersMiddleware
from caldera.server.lab_errors import LabRefused
from caldera.server.platform import Platform
from caldera.server.security import LAB_SESSION, LAB_TICKET, TokenError, credentials_current, decode_lab, issue_lab


class SpentTickets:
    """Ticket ids already used, kept until the tickets would have expired anyway."""

    def __init__(self) -> None:
        self._spent: dict[str, float] = {}
        self._lock = threading.Lock()

    def spend(self, jti: str, expires_at: float) -> bool:
        now = time.time()
        with self._lock:
            self._spent = {k: t for k, t in self._spent.items() if t > now}
            if not jti or jti in self._spent:
                return False
            self._spent[jti] = expires_at
            return True


class LabHostMiddleware:
    """Routes by Host: a request is for the lab its Host names (``request.state.lab_job``, its home
    ``lab_home``), or it is refused here, before any route sees it."""

    def __init__(self, app: ASGIApp, platform: Platform):
        self.app, self.platform = app, platform

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
        try:
            job_id, home = await asyncio.to_thread(lab_proxy.host_job, self.platform, host)
        except HTTPException as exc:
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
            else:
                await lab_errors.response(HTTPConnection(scope), exc)(scope, receive, send)
            return
        scope.setdefault("state", {}).update(lab_job=job_id, lab_home=home)
        await self.app(scope, receive, send)


def create_lab_app(platform: Platform) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.lab_clients = {}
        try:
            yield
        finally:
            for client in app.state.lab_clients.values():
                await client.aclose()

    app = FastAPI(title="Caldera labs", lifespan=lifespan, openapi_url=None, docs_url=None, redoc_url=None)
    app.state.platform = platform
    app.state.spent_tickets = SpentTickets()

    @app.exception_handler(HTTPException)
    async def _refused(request: Request, exc: HTTPException):
        return lab_errors.response(request, exc)

    @app.exception_handler(CalderaError)
    async def _domain(_: Request, exc: CalderaError):
        return JSONResponse({"detail": exc.message}, status_code=exc.status)

    @app.get("/_caldera/lab-login", include_in_schema=False)
    def lab_login(request: Request, ticket: str = Query(..., max_length=2048), next: str = Query(..., max_length=4096)):
        p = platform
        job_id = request.state.lab_job
        try:
            claims = decode_lab(p.keys, ticket, LAB_TICKET)
        except TokenError as exc:
            raise LabRefused(401, "TicketRefused", why=str(exc)) from None
        if claims.job_id != job_id:
            raise LabRefused(401, "TicketForAnotherLab")
        home = request.state.lab_home
        # a path of this lab: never "//host" or "/\\host", which a browser takes for another site
        if not next.startswith(home) or next.startswith(("//", "/\\")):
            raise LabRefused(400, "TicketForAnotherJob")
        if not app.state.spent_tickets.spend(claims.jti, claims.issued_at + 300):
            raise LabRefused(401, "TicketUsed")
        with p.session() as db:
            user = db.get(User, claims.user_id)
            if not credentials_current(user, claims.issued_at):
                raise LabRefused(401, "TicketLogInAgain")
            jobs.visible(db, user, claims.job_id)
        ttl = p.settings.lab_cookie_ttl_s
        resp = RedirectResponse(next, status_code=303)
        resp.set_cookie(
            lab_proxy.LAB_COOKIE,
            issue_lab(p.keys, LAB_SESSION, claims.user_id, claims.job_id, ttl),
            max_age=ttl,
            path=home,
            httponly=True,
            samesite="lax",
            secure=p.settings.lab_url_template.startswith("https"),
        )  # no Domain: this lab's host alone
        return resp

    app.add_middleware(LabHostMiddleware, platform=platform)
    app.add_middleware(SecurityHeadersMiddleware, headers=headers.COMMON)  # Lab frames itself: no frame ban here
    app.include_router(lab_proxy.router)
    return app
