"""`caldera node`: cordon, drain and uncordon nodes (admins)."""

from __future__ import annotations

import typer

from caldera.cli.common import call, client, console

nodes_admin_app = typer.Typer(help="Cordon, drain and uncordon nodes (admins).", no_args_is_help=True)
REASON = typer.Option("", help="why, shown to users whose jobs wait or were preempted")


@nodes_admin_app.command()
def cordon(node: str, reason: str = REASON) -> None:
    """No new job starts on NODE; running ones keep running."""
    call(client().post, f"/admin/nodes/{node}/cordon", {"reason": reason})
    console.print(f"{node} cordoned")


@nodes_admin_app.command()
def drain(node: str, reason: str = REASON) -> None:
    """Cordon NODE and preempt its running jobs (they requeue)."""
    out = call(client().post, f"/admin/nodes/{node}/drain", {"reason": reason})
    preempted = ", ".join(out["preempted"]) or "none"
    console.print(f"{node} drained; preempted: {preempted}")


@nodes_admin_app.command()
def uncordon(node: str) -> None:
    """Let jobs start on NODE again."""
    call(client().post, f"/admin/nodes/{node}/uncordon")
    console.print(f"{node} uncordoned")
