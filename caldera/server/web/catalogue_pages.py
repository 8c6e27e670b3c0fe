"""Datasets and models: the catalogue entries I may read, searched as the API searches them
(caldera/server/api_catalogue.py), each with the line a job spec mounts it by."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from sqlalchemy.orm import Session

from caldera.db.models import User
from caldera.server import api_catalogue
from caldera.server.api_files import Caller
from caldera.server.deps import db_session
from caldera.server.web.render import page
from caldera.server.web.session import page_user
from caldera.storage.catalogue import KINDS

router = APIRouter(include_in_schema=False)


@router.get("/data")
def catalogue(
    request: Request, kind: str = "", q: str = "", user: User = Depends(page_user), db: Session = Depends(db_session)
):
    kind, q = (kind if kind in KINDS else ""), q[:200]
    entries = api_catalogue.search(kind=kind or None, q=q, c=Caller(user, db, request.app.state.spaces))
    return page(request, "catalogue.html", user=user, entries=entries, kind=kind, q=q)
