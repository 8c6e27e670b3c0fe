"""Types of the integers routes take from a path or a query string, bounded where the database bounds them: a value
past a column's range is a 400 before any query sees it (SQLite raises OverflowError past 2**63 - 1, PostgreSQL's
``integer`` a DataError past 2**31 - 1). Every integer parameter of every route uses one of these or states bounds
of its own within ``INT64_MAX`` (tests/test_api_hardening.py reads the route table to hold that)."""

from __future__ import annotations

from typing import Annotated

from annotated_types import Interval

DB_INT_MAX = 2**31 - 1  # an Integer column (row ids) on PostgreSQL, the narrower of the two databases
INT64_MAX = 2**63 - 1  # a BigInteger column, and the widest integer SQLite stores

RowId = Annotated[int, Interval(ge=1, le=DB_INT_MAX)]
Offset = Annotated[int, Interval(ge=0, le=INT64_MAX)]  # bytes into a log; past its end gives nothing
