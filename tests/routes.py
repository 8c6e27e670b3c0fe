"""The app's route table as the tests read it (one place: FastAPI 0.16x includes routers lazily, so ``app.routes``
holds the routers, not their routes)."""

from __future__ import annotations

from typing import Any

from fastapi import routing


def api_routes(app) -> list[Any]:
    """Every route with a FastAPI dependant (API and pages): each has ``path``, ``methods`` (None for a
    websocket route), ``dependant``."""
    every = routing.iter_route_contexts(app.routes) if hasattr(routing, "iter_route_contexts") else app.routes
    return [r for r in every if getattr(r, "dependant", None) is not None]
