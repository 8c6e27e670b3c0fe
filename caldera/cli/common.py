"""What every verb module of the CLI shares: the consoles, the SDK client from the credentials, API errors as
exit code 1 with the API's field errors, times."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import typer
from rich.console import Console

from caldera.client import ApiError, Client

console = Console()
err = Console(stderr=True)


def ts(t: float | None) -> str:
    return datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S") if t else "-"


def say_error(exc: ApiError) -> None:
    err.print(f"[red]error {exc.status}: {exc.detail}[/red]")
    for e in exc.errors:
        err.print(f"  [yellow]{e.get('field')}[/yellow]: {e.get('reason')}")


def client() -> Client:
    try:
        return Client.from_config()
    except ApiError as exc:
        err.print(f"[red]{exc.detail}[/red]")
        raise typer.Exit(1) from None


def call(fn, *args, **kwargs) -> Any:
    try:
        return fn(*args, **kwargs)
    except ApiError as exc:
        say_error(exc)
        raise typer.Exit(1) from None
