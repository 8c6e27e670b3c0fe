"""Interactive sessions from the command line: ``caldera vscode`` starts VS Code in the browser (code-server) in a
job and prints the address that opens it, through the platform's login like every lab."""

from __future__ import annotations

import time

import typer

from caldera.cli.common import call, client, console, err
from caldera.client import ENDED


def vscode(
    name: str = typer.Option("vscode", help="the session's name"),
    gpus: int = typer.Option(0, help="whole GPUs"),
    image: str | None = typer.Option(None, help="image to run in (container runtime; it must hold code-server)"),
    workdir: str | None = typer.Option(None, help="folder of my workspace to open (the workspace when omitted)"),
    queue: str | None = typer.Option(None),
    account: str | None = typer.Option(None),
    cpu: float | None = typer.Option(None, help="CPU cores"),
    memory_mib: int | None = typer.Option(None, help="memory, MiB"),
    wait_: bool = typer.Option(True, "--wait/--no-wait", help="wait until the editor answers"),
    timeout: float = typer.Option(600.0, help="seconds to wait for it at most"),
) -> None:
    """Start VS Code in the browser in a job of mine and print the address that opens it."""
    resources: dict = {"gpu": gpus}
    for key, value in (("cpu", cpu), ("memory_mib", memory_mib)):
        if value is not None:
            resources[key] = value
    spec: dict = {"name": name, "kind": "vscode", "resources": resources}
    for key, value in (("image", image), ("workdir", workdir), ("queue", queue), ("account", account)):
        if value:
            spec[key] = value
    c = client()
    job = call(c.submit, spec)
    url = f"{c.url}/jobs/{job['id']}/lab/"
    console.print(f"submitted [bold]{job['id']}[/bold] ({job['name']}) to {job['queue']}: {job['state']}")
    deadline = time.monotonic() + timeout
    while wait_ and job["state"] != "Running":
        if job["state"] in ENDED:
            err.print(f"{job['id']}: {job['state']}: {job.get('message') or ''}".rstrip(": "))
            raise typer.Exit(1)
        if time.monotonic() > deadline:
            err.print(f"{job['id']} still {job['state']} after {timeout:g} s; it opens at {url} once running")
            raise typer.Exit(1)
        time.sleep(1.0)
        job = call(c.get, f"/jobs/{job['id']}")
    console.print(f"open {url}" if wait_ else f"it opens at {url} once running")


def register(app: typer.Typer) -> None:
    app.command("vscode")(vscode)
