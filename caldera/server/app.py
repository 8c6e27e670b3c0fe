"""The FastAPI application."""

from __future__ import annotations

from contextlib import asynccontextmanager

from a2wsgi import WSGIMiddleware
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError

from caldera.core.spec import SpecError, field_path
from caldera.core.states import InvalidTransition
from caldera.images.builds import BuildQueue
from caldera.server import (
    api_accounting,
    api_admin,
    api_arrays,
    api_auth,
    api_catalogue,
    api_exec,
    api_files,
    api_governance,
    api_images,
    api_jobs,
    api_metrics,
    api_notifications,
    api_ssh_keys,
    api_templates,
    audit,
    authenticators,
    catalogue_copies,
    files,
    lab_entry,
    node_admin,
    ssh_relay,
    web,
    webdav,
)
from caldera.server.csrf import CSRFMiddleware
from caldera.server.errors import CalderaError
from caldera.server.headers import DOCS_CSP, SecurityHeadersMiddleware, platform_headers
from caldera.server.limits import BodyLimitMiddleware
from caldera.server.loop import SchedulerLoop
from caldera.server.notifications import Dispatcher
from caldera.server.platform import Platform
from caldera.server.ratelimit import LoginThrottle


def create_app(platform: Platform, run_loop: bool = True) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        loop = SchedulerLoop(platform)
        app.state.loop = loop
        app.state.builds = BuildQueue(platform)  # its worker starts with the first build
        loop.governor.builds = app.state.builds  # an idle session is saved before it is stopped
        dispatcher = Dispatcher(platform)
        reconciler = files.Reconciler(platform, app.state.spaces)
        if run_loop:
            loop.start()
            dispatcher.start()
            reconciler.start()
            catalogue_copies.recover(platform)  # versions a stopped server left copying
        try:
            yield
        finally:
            catalogue_copies.stop(platform)  # first: a job's publish waits for its copy
            loop.stop()
            dispatcher.stop()
            reconciler.stop()
            app.state.builds.stop()

    app = FastAPI(
        title="Caldera",
        version="0.1.0",
        lifespan=lifespan,
        openapi_url="/api/v1/openapi.json",
        docs_url="/api/v1/docs",
        redoc_url=None,
    )
    app.state.platform = platform
    app.state.spaces = files.spaces_for(platform)
    s = platform.settings
    app.state.authenticators = [authenticators.LocalAccounts()]  # LDAP/OIDC plug in here
    app.state.login_throttle = LoginThrottle(
        s.login_max_failures_per_user, s.login_max_failures_per_address, s.login_window_s
    )
    # outermost last: headers on every answer (a 413 or a CSRF refusal too), the size limit before anything reads
    app.add_middleware(
        CSRFMiddleware, public_url=s.url, lab_url_template=s.lab_url_template, secure=s.url.startswith("https")
    )
    app.add_middleware(
        BodyLimitMiddleware,
        max_bytes=s.max_body_bytes,
        larger=(
            ("PATCH", api_files.UPLOAD_CHUNK_PATH, s.storage_chunk_bytes),
            ("PUT", webdav.ANY_PATH, s.storage_max_upload_bytes),
        ),
    )
    app.add_middleware(
        SecurityHeadersMiddleware,
        headers=platform_headers(s.lab_url("*")),
        by_path={"/api/v1/docs": {"Content-Security-Policy": DOCS_CSP}},
    )

    @app.exception_handler(SpecError)
    async def _spec(_: Request, exc: SpecError):
        return JSONResponse({"detail": str(exc), "errors": exc.errors}, status_code=400)

    @app.exception_handler(CalderaError)
    async def _domain(_: Request, exc: CalderaError):
        return JSONResponse({"detail": exc.message, "errors": getattr(exc, "errors", [])}, status_code=exc.status)

    @app.exception_handler(DataError)
    async def _data(_: Request, exc: DataError):
        # a value the database cannot hold (a NUL character in PostgreSQL text, an integer out of range): bad
        # input, whichever route let it through
        return JSONResponse({"detail": "invalid value: " + str(exc.orig).splitlines()[0][:200]}, status_code=400)

    @app.exception_handler(InvalidTransition)
    async def _transition(_: Request, exc: InvalidTransition):
        return JSONResponse({"detail": str(exc)}, status_code=409)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError):
        errors = [
            {"field": field_path(tuple(e["loc"][1:])) or str(e["loc"][0]), "reason": e["msg"]} for e in exc.errors()
        ]
        return JSONResponse(
            {"detail": "; ".join(f"{e['field']}: {e['reason']}" for e in errors), "errors": errors}, status_code=400
        )

    @app.get("/api/v1/health", tags=["meta"])
    def health() -> dict:
        return {"ok": True}

    routers = (
        api_auth.router,
        api_ssh_keys.router,
        api_notifications.router,
        api_jobs.router,
        api_arrays.router,
        api_files.router,
        api_catalogue.router,
        api_exec.router,
        ssh_relay.router,
        api_governance.router,
        api_images.router,
        api_admin.router,
        api_metrics.router,
        api_templates.router,
        audit.router,
        node_admin.router,
        api_accounting.router,
    )
    for r in (*routers, lab_entry.router):
        app.include_router(r)
    app.mount(webdav.MOUNT, WSGIMiddleware(webdav.dav_app(platform, app.state.spaces)))
    web.install(app)
    return app
