"""``-o table|json|yaml`` for every listing and ``describe``: JSON and YAML are the API's own objects."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from enum import Enum
from typing import Any

import typer


class Format(str, Enum):
    table = "table"
    json = "json"
    yaml = "yaml"


OUTPUT = typer.Option(Format.table, "--output", "-o", help="table, or the API's objects as json or yaml")


def emit(obj: Any, fmt: Format, table: Callable[[Any], None]) -> None:
    """Print ``obj`` as JSON or YAML, or hand it to ``table`` for people."""
    if fmt is Format.json:
        sys.stdout.write(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")
    elif fmt is Format.yaml:
        import yaml

        sys.stdout.write(yaml.safe_dump(obj, sort_keys=False, allow_unicode=True))
    else:
        table(obj)
