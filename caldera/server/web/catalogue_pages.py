"""Datasets and models: the catalogue entries I may read, searched as the API searches them
(caldera/server/api_catalogue.py), each with the line a job spec mounts it by; and, from a space's folder page,
publishing the folder shown as a version and importing a file from a URL into it, through the API's own functions
(every rule, limit and refusal is the API's), with the import's progress refreshed in place."""

from __future__ import annotations

from urllib.parse import urlencode

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import RedirectResponse
from sqlalchemy.orm import Session

from caldera import outbound
from caldera.db.models import User
from caldera.server import api_catalogue
from caldera.server.deps import db_session, platform
from caldera.server.platform import Platform
from caldera.server.web import api_call
from caldera.server.web.file_pages import folder_page, folder_url, import_view, page_caller, readable
from caldera.server.web.render import page
from caldera.server.web.session import PageNotFound, page_user
from caldera.storage.catalogue import KINDS
from caldera.storage.paths import MAX_PATH_CHARS

router = APIRouter(include_in_schema=False)


@router.get("/data")
def catalogue(
    request: Request, kind: str = "", q: str = "", user: User = Depends(page_user), db: Session = Depends(db_session)
):
    kind, q = (kind if kind in KINDS else ""), q[:200]
    entries = api_catalogue.search(kind=kind or None, q=q, c=page_caller(request, user, db))
    return page(request, "catalogue.html", user=user, entries=entries, kind=kind, q=q)


@router.post("/files/{space}/publish")
def publish(
    request: Request,
    space: str,
    path: str = Form("", max_length=MAX_PATH_CHARS),
    kind: str = Form(..., max_length=16),
    name: str = Form(..., max_length=200),
    version: str = Form(..., max_length=200),
    description: str = Form("", max_length=4000),
    visibility: str = Form("private", max_length=16),
    shared_with: str = Form("", max_length=20000),
    framework: str = Form("", max_length=200),
    user: User = Depends(page_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
):
    """The folder shown as a new version; on to the catalogue's page, which lists it."""
    c, space = page_caller(request, user, db), space[:80]
    readable(c, space)  # another user's space: no page, as for its folders

    def call():
        body = api_catalogue.PublishIn(
            kind=kind, name=name.strip(), version=version.strip(), space=space, path=path, description=description,
            visibility=visibility, shared_with=shared_with.split(), framework=framework.strip(),
        )  # fmt: skip
        return api_catalogue.publish(body, c, p)

    published, errors = api_call.call(db, call)
    if errors:
        values = {"kind": kind, "name": name, "version": version, "description": description,
                  "visibility": visibility, "shared_with": shared_with, "framework": framework}  # fmt: skip
        return folder_page(request, p, c, space, path, "", errors, status=400, values=values)
    return RedirectResponse("/data?" + urlencode({"q": published["name"]}), 303)


@router.post("/files/{space}/import")
def start_import(
    request: Request,
    space: str,
    folder: str = Form("", max_length=MAX_PATH_CHARS),
    url: str = Form(..., max_length=outbound.MAX_URL_CHARS),
    name: str = Form(..., max_length=MAX_PATH_CHARS),
    user: User = Depends(page_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
):
    """Download ``url`` as ``name`` in the folder shown; back to the folder, which shows the import's progress."""
    c, space = page_caller(request, user, db), space[:80]
    readable(c, space)
    at = f"{folder}/{name.strip()}" if folder else name.strip()
    body = {"url": url.strip(), "space": space, "path": at}
    started, errors = api_call.call(db, lambda: api_catalogue.start_import(api_catalogue.ImportIn(**body), request, c))
    if errors:
        return folder_page(request, p, c, space, folder, "", errors, status=400, values={"url": url, "as": name})
    return RedirectResponse(folder_url(space, folder, imported=started["id"]), 303)


@router.get("/partials/imports/{import_id}")
def import_progress(
    request: Request, import_id: str, user: User = Depends(page_user), db: Session = Depends(db_session)
):
    """An import's progress, refreshed in place by HTMX while it runs."""
    imp = import_view(page_caller(request, user, db), import_id)
    if imp is None:
        raise PageNotFound()
    return page(request, "_import_progress.html", imp=imp, folder_url=folder_url)
