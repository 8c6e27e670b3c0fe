"""The web portal: server-rendered pages (Jinja2 templates, own JavaScript in static files, HTMX from npm) on the
API's own functions and permission checks."""

from __future__ import annotations

from urllib.parse import urlsplit

from fastapi import FastAPI, Request, Response
from fastapi.responses import RedirectResponse
from fastapi.staticfiles import StaticFiles

from caldera.server.web import (
    account_pages,
    admin_account_pages,
    admin_pages,
    array_pages,
    auth_pages,
    catalogue_pages,
    file_pages,
    governance_pages,
    image_pages,
    job_publish_pages,
    jobs_pages,
    metrics_pages,
    notification_pages,
    template_pages,
)
from caldera.server.web.render import STATIC, page
from caldera.server.web.session import LoginRequired, PageForbidden, PageNotFound, login_url


def install(app: FastAPI) -> None:
    for r in (
        auth_pages.router,
        account_pages.router,
        notification_pages.router,
        jobs_pages.router,
        job_publish_pages.router,
        array_pages.router,
        governance_pages.router,
        metrics_pages.router,
        template_pages.router,
        image_pages.router,
        catalogue_pages.router,
        file_pages.router,
        admin_pages.router,
        admin_account_pages.router,
    ):
        app.include_router(r)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.exception_handler(LoginRequired)
    async def _login(request: Request, exc: LoginRequired):
        if request.headers.get("hx-request"):  # an in-place refresh: the whole page goes to the login form
            back = urlsplit(request.headers.get("hx-current-url", "")[:2048]).path or "/"
            return Response(status_code=204, headers={"HX-Redirect": login_url(back)})
        return RedirectResponse(login_url(exc.next_path), 303)

    @app.exception_handler(PageForbidden)
    async def _forbidden(request: Request, _: PageForbidden):
        return page(request, "error.html", status=403, code=403)

    @app.exception_handler(PageNotFound)
    async def _not_found(request: Request, _: PageNotFound):
        return page(request, "error.html", status=404, code=404)
