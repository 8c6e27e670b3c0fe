"""The refusals storage gives, each an API answer with its reason (caldera.errors)."""

from __future__ import annotations

from caldera.errors import Conflict, Forbidden, Invalid, NotFound


class PathRefused(Invalid):
    def __init__(self, reason: str):
        super().__init__("path", reason)


class NoSuchPath(NotFound):
    pass


class NameClash(Conflict):
    pass


class NoAccess(Forbidden):
    pass


class QuotaExceeded(Conflict):
    """409 in the API (the space's state refuses it: no 5xx for a user's request); WebDAV answers 507."""

    def __init__(self, message: str):
        super().__init__(message, "QuotaExceeded")


class CatalogueFull(Conflict):
    """A publisher's versions in the catalogue are at ``catalogue_max_entries`` or ``catalogue_quota_bytes``."""


def catalogue_entries_full(limit: int) -> CatalogueFull:
    return CatalogueFull(
        f"you have {limit} versions in the catalogue, the most one user may have: delete one first",
        "CatalogueEntriesFull",
        {"limit": limit},
    )


def catalogue_bytes_full(limit: int, used: int) -> CatalogueFull:
    return CatalogueFull(
        f"your catalogue versions may take {limit} bytes together and take {used}: this folder does not fit",
        "CatalogueBytesFull",
        {"limit": limit, "used": used},
    )


class NotReady(Conflict):
    """A catalogue version that is still being copied, or whose copy failed: nothing mounts it."""
