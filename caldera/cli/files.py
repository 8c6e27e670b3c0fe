"""`caldera files`: the storage spaces (docs/storage.md) from a terminal, with progress bars for transfers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn
from rich.table import Table

from caldera.cli.common import call, client, console, err, ts
from caldera.cli.output import OUTPUT, Format, emit

files_app = typer.Typer(help="Files in your spaces: personal, account:<name>, public.", no_args_is_help=True)
SPACE = typer.Option("personal", "--space", "-s", help="personal, personal:<user>, account:<name> or public")


@contextmanager
def _bar(what: str) -> Iterator[Callable[[int, int], None]]:
    columns = ("[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
               TimeRemainingColumn())  # fmt: skip
    with Progress(*columns, console=err, transient=True) as progress:
        task = progress.add_task(what, total=None)

        def update(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        yield update


@files_app.command("spaces")
def spaces(output: Format = OUTPUT) -> None:
    """The spaces you may reach, with their usage and quotas."""
    rows = call(client().spaces)
    emit(rows, output, _spaces_table)


def _spaces_table(rows: list[dict]) -> None:
    t = Table("SPACE", "ACCESS", "USED", "QUOTA", "FILES", "FILE QUOTA")
    for r in rows:
        t.add_row(r["space"], r["access"], _size(r["used_bytes"]), _size(r["quota_bytes"]), str(r["used_files"]),
                  str(r["quota_files"]))  # fmt: skip
    console.print(t)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


@files_app.command("ls")
def ls(path: str = typer.Argument("", help="a folder of the space"), space: str = SPACE, output: Format = OUTPUT):
    """List a folder (every page of it)."""
    rows = call(lambda: list(client().ls(path, space=space)))
    emit(rows, output, _ls_table)


def _ls_table(rows: list[dict]) -> None:
    t = Table("NAME", "KIND", "SIZE", "MODIFIED")
    for r in rows:
        t.add_row(r["name"] + ("/" if r["kind"] == "dir" else ""), r["kind"], _size(r["size"]), ts(r["modified"]))
    console.print(t)


@files_app.command("put")
def put(
    local: Path = typer.Argument(..., exists=True, dir_okay=False, help="the file to upload"),
    remote: str = typer.Argument("", help="where in the space; the file's name at its root when empty"),
    space: str = SPACE,
    chunk_mib: int = typer.Option(8, min=1, max=64, help="size of each chunk"),
) -> None:
    """Upload a file in chunks; run it again after an interruption and it resumes."""
    target = remote or local.name
    if target.endswith("/"):
        target += local.name
    with _bar(f"put {local.name}") as update:
        call(client().upload, local, target, space=space, chunk_bytes=chunk_mib * 2**20, progress=update)
    console.print(f"uploaded {local} to {space}:{target}")


@files_app.command("get")
def get(
    remote: str = typer.Argument(..., help="a file of the space"),
    local: Path = typer.Argument(None, help="where to save it; its own name here when empty"),
    space: str = SPACE,
) -> None:
    """Download a file."""
    local = local or Path(remote.rstrip("/").rsplit("/", 1)[-1])
    if local.is_dir():
        local = local / remote.rstrip("/").rsplit("/", 1)[-1]
    with _bar(f"get {remote}") as update:
        call(client().download, remote, local, space=space, progress=update)
    console.print(f"downloaded {space}:{remote} to {local}")


@files_app.command("mkdir")
def mkdir(path: str, space: str = SPACE, parents: bool = typer.Option(False, "--parents", "-p")) -> None:
    call(client().mkdir, path, space=space, parents=parents)


@files_app.command("mv")
def mv(src: str, dst: str, space: str = SPACE) -> None:
    """Rename or move inside a space; an existing name at DST is an error, never overwritten."""
    call(client().move, src, dst, space=space)


@files_app.command("rm")
def rm(path: str, space: str = SPACE) -> None:
    """Delete a file, a link or a folder with everything in it."""
    freed = call(client().remove, path, space=space)
    console.print(f"removed {path}: {_size(freed['freed_bytes'])} in {freed['freed_files']} entries")
