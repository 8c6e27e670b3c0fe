"""`caldera request`: ask to extend a job's runtime limit or to lock it against idle stopping, list requests, and
approve or decline them (an account admin or an admin). `caldera admin account-admin` names account admins."""

from __future__ import annotations

import re

import typer
from rich.table import Table

from caldera.cli.common import call, client, console, ts
from caldera.cli.output import OUTPUT, Format, emit

request_app = typer.Typer(help="Extend or lock jobs, and decide such requests.", no_args_is_help=True)
FOR = typer.Option(..., "--for", help="how long: 90m, 12h, 2d")
REASON = typer.Option(..., "--reason", help="why (shown to whoever decides)")
NOTE = typer.Option("", "--note", help="a word for the requester")
_UNITS = {"m": 60, "h": 3600, "d": 86400}


def seconds(value: str) -> int:
    """90m, 12h or 2d as seconds."""
    m = re.fullmatch(r"(\d+)([mhd])", value.strip())
    if not m:
        raise typer.BadParameter(f"{value!r}: expected 90m, 12h or 2d")
    return int(m.group(1)) * _UNITS[m.group(2)]


def _ask(job_id: str, kind: str, length: str, reason: str) -> None:
    c = client()
    out = call(c.post, f"/jobs/{call(c.resolve_job, job_id)}/requests",
               {"kind": kind, "seconds": seconds(length), "reason": reason})  # fmt: skip
    console.print(f"request {out['id']} to {kind} job {out['job']} is waiting for a decision")


@request_app.command()
def extend(job_id: str, length: str = FOR, reason: str = REASON) -> None:
    """Ask to let JOB_ID run longer than its queue's runtime limit."""
    _ask(job_id, "extend", length, reason)


@request_app.command()
def lock(job_id: str, length: str = FOR, reason: str = REASON) -> None:
    """Ask that JOB_ID is not stopped for idle GPUs for a while."""
    _ask(job_id, "lock", length, reason)


@request_app.command("ls")
def list_requests(
    pending: bool = typer.Option(False, "--pending", help="only those waiting for a decision"), output: Format = OUTPUT
) -> None:
    """My requests, and those I may decide."""
    rows = call(client().get, "/requests", state=["pending"] if pending else None)
    emit(rows, output, _table)


def _table(rows: list[dict]) -> None:
    t = Table("ID", "JOB", "USER", "KIND", "FOR", "STATE", "ASKED", "REASON", "DECIDED BY")
    for r in rows:
        t.add_row(str(r["id"]), r["job"], r["user"] or "", r["kind"], f"{r['seconds'] / 3600:g}h", r["state"],
                  ts(r["created_at"]), r["reason"], r["decided_by"] or "")  # fmt: skip
    console.print(t)


def _decide(request_id: int, approve: bool, note: str) -> None:
    out = call(client().post, f"/requests/{request_id}/decision", {"approve": approve, "note": note})
    console.print(f"request {out['id']} ({out['kind']} job {out['job']}): {out['state']}")


@request_app.command()
def approve(request_id: int, note: str = NOTE) -> None:
    """Approve request REQUEST_ID."""
    _decide(request_id, True, note)


@request_app.command()
def decline(request_id: int, note: str = NOTE) -> None:
    """Decline request REQUEST_ID."""
    _decide(request_id, False, note)


def account_admin(
    account: str, username: str, remove: bool = typer.Option(False, "--remove", help="no longer its admin")
) -> None:
    """Make USERNAME, a member of ACCOUNT, an admin of it: they decide its members' requests."""
    call(client().put, f"/accounts/{account}/admins/{username}", {"admin": not remove})
    console.print(f"{username} is {'no longer' if remove else 'now'} an admin of account {account}")
