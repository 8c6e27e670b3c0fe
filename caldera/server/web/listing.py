"""A portal list paged, sorted and filtered by the database from the URL's query: ``page``, ``size``, ``sort`` (a
key of the page's allowlist, "-" first for descending) and the page's own filters. A hand-made URL never breaks a
page: a page number or size out of range is clamped, an unknown sort key falls back to the page's default, a filter
is cut to its size limit. Templates draw the headers and the pager with ``sort_header`` and ``pager``
(_macros.html) from ``Listing.args``."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from fastapi import Request
from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

MAX_SIZE = 200  # rows on one page, whatever the URL asks
MAX_PAGE = 1_000_000
MAX_FILTER_CHARS = 256
SIZES = (25, 50, 100, MAX_SIZE)  # the choices the pages offer


@dataclass(frozen=True)
class Listing:
    page: int
    size: int
    sort: str
    filters: dict[str, str]
    default_size: int
    default_sort: str
    total: int = 0
    pages: int = 1

    @property
    def args(self) -> dict[str, Any]:
        """The query that shows this list again from its first page: the filters set, the sort and size chosen."""
        args: dict[str, Any] = {k: v for k, v in self.filters.items() if v}
        if self.sort != self.default_sort:
            args["sort"] = self.sort
        if self.size != self.default_size:
            args["size"] = self.size
        return args

    @property
    def first(self) -> int:
        """The position of the page's first row, counted from 1 (0: nothing listed)."""
        return min(self.total, (self.page - 1) * self.size + 1)

    @property
    def last(self) -> int:
        return min(self.total, self.page * self.size)


def _number(text: str | None, default: int, low: int, high: int) -> int:
    try:
        value = int(text) if text is not None else default
    except ValueError:
        value = default
    return min(high, max(low, value))


def parse(request: Request, sorts: Mapping[str, Any], default_sort: str, filters: Sequence[str] = (),
          size: int = 50) -> Listing:  # fmt: skip
    """The list the URL asks for; ``sorts`` is the page's allowlist of sort keys (key: the column to order by)."""
    q = request.query_params
    sort = q.get("sort", default_sort)
    if sort.removeprefix("-") not in sorts:
        sort = default_sort
    return Listing(
        page=_number(q.get("page"), 1, 1, MAX_PAGE),
        size=_number(q.get("size"), size, 1, MAX_SIZE),
        sort=sort,
        filters={k: q.get(k, "")[:MAX_FILTER_CHARS].strip() for k in filters},
        default_size=size,
        default_sort=default_sort,
    )


def fetch(db: Session, query: Select, listing: Listing, sorts: Mapping[str, Any], tiebreak: Any):
    """One page of ``query``'s rows in the listing's order (``tiebreak``, a unique column, keeps it stable), and
    the listing with its total; a page past the end shows the last one."""
    total = db.scalar(select(func.count()).select_from(query.order_by(None).subquery())) or 0
    pages = max(1, math.ceil(total / listing.size))
    page = min(listing.page, pages)
    descending = listing.sort.startswith("-")
    order = [c.desc() if descending else c.asc() for c in (sorts[listing.sort.removeprefix("-")], tiebreak)]
    rows = db.scalars(query.order_by(*order).offset((page - 1) * listing.size).limit(listing.size))
    return list(rows), replace(listing, page=page, total=total, pages=pages)
