"""`caldera data`: the datasets and models catalogue and imports from URL (docs/storage.md)."""

from __future__ import annotations

import time

import typer
from rich.table import Table

from caldera.cli.common import call, client, console, ts
from caldera.cli.files import SPACE, _bar, _size
from caldera.cli.output import OUTPUT, Format, emit

data_app = typer.Typer(help="Datasets and models: publish, find, import from a URL.", no_args_is_help=True)
KIND = typer.Option(None, "--kind", "-k", help="dataset or model (both when empty)")


@data_app.command("ls")
def ls(words: list[str] = typer.Argument(None, help="words each entry shown holds"), kind: str = KIND,
       output: Format = OUTPUT) -> None:  # fmt: skip
    """The datasets and models you may read (search their names, descriptions, tags)."""
    rows = call(client().get, "/catalogue", kind=kind, q=" ".join(words or []))
    emit(rows, output, _table)


def _table(rows: list[dict]) -> None:
    t = Table("KIND", "NAME", "STATE", "OWNER", "VISIBILITY", "SIZE", "PUBLISHED", "DESCRIPTION")
    for r in rows:
        t.add_row(r["kind"], r["ref"], r["state"], r["owner"], r["visibility"], _size(r["size_bytes"]),
                  ts(r["created_at"]), r["description"][:60])  # fmt: skip
    console.print(t)


@data_app.command("show")
def show(
    ref: str = typer.Argument(..., help="name or name@version (its newest version you may read)"),
    kind: str = typer.Option("dataset", "--kind", "-k"),
    output: Format = OUTPUT,
) -> None:
    """One dataset or model."""
    emit(call(client().get, f"/catalogue/{kind}/{ref}"), output, lambda r: _table([r]))


@data_app.command("publish")
def publish(
    name: str = typer.Argument(..., help="the entry's name: lower-case letters, digits, . _ -"),
    version: str = typer.Argument(..., help="e.g. v1; a published version never changes"),
    path: str = typer.Option("", "--path", "-p", help="the folder of the space (its root when empty)"),
    space: str = SPACE,
    kind: str = typer.Option("dataset", "--kind", "-k", help="dataset or model"),
    description: str = typer.Option("", "--description", "-d"),
    tags: list[str] = typer.Option([], "--tag", "-t"),
    visibility: str = typer.Option("private", help="private, shared or public"),
    share: list[str] = typer.Option([], "--share", help="user:<name> or account:<name> (visibility shared)"),
    framework: str = typer.Option("", help="models: pytorch, jax..."),
    job: str = typer.Option(
        "", "--from-job", "--job", help="models: a job of yours that succeeded; --path: a folder of its workspace"
    ),
    wait: bool = typer.Option(True, help="follow the copy until the version is ready (--no-wait: return at once)"),
    output: Format = OUTPUT,
) -> None:
    """Publish a folder of a space you may write; the platform copies it, in its background."""
    body = {"space": space, "path": path, "description": description, "tags": tags, "visibility": visibility,
            "shared_with": share, "framework": framework, "from_job": job}  # fmt: skip
    c = client()
    entry = call(c.publish, name, version, kind=kind, wait=False, **body)
    if wait:
        with _bar(f"copy {kind} {entry['ref']}") as update:
            entry = call(c.wait_published, kind, entry["ref"], progress=lambda e: update(e["size_bytes"], 0))
    emit(entry, output, lambda r: _table([r]))
    if entry.get("left_out") and output == Format.table:
        console.print(f"left out: {'; '.join(entry['left_out'][:5])}")


@data_app.command("rm")
def rm(ref: str = typer.Argument(..., help="name@version"), kind: str = typer.Option("dataset", "--kind", "-k")):
    """Delete a version you own (refused while a running job mounts it)."""
    name, _, version = ref.partition("@")
    if not version:
        raise typer.BadParameter("name@version: a version is deleted one at a time")
    call(client().delete, f"/catalogue/{kind}/{name}/{version}")
    console.print(f"deleted {kind} {ref}")


@data_app.command("writers")
def writers(
    name: str = typer.Argument(..., help="a name of yours"),
    grant: list[str] = typer.Argument(None, help="user:<name> or account:<name>; the list replaces the one before"),
    kind: str = typer.Option("dataset", "--kind", "-k"),
    clear: bool = typer.Option(False, "--clear", help="nobody else publishes under the name"),
    output: Format = OUTPUT,
) -> None:
    """Who besides you publishes new versions under a name of yours: shown, or set with WRITERS or --clear."""
    c = client()
    if grant or clear:
        if grant and clear:
            raise typer.BadParameter("give writers or --clear, not both")
        got = call(c.put, f"/catalogue/{kind}/{name}/writers", {"writers": grant or []})
    else:
        got = call(c.get, f"/catalogue/{kind}/{name}/writers")
    emit(got, output, lambda r: console.print(f"{r['kind']} {r['name']}: {r['owner']}, and "
                                              f"{', '.join(r['writers']) or 'nobody else'}"))  # fmt: skip


@data_app.command("import")
def import_url(
    url: str = typer.Argument(..., help="an http(s) URL, or hf://[datasets/]OWNER/REPO[@REV] (the server's mirror)"),
    remote: str = typer.Argument(
        "", help="the new file's (a repository's: folder's) path in the space; the URL's last name when empty"
    ),
    space: str = SPACE,
    restart: str = typer.Option("", "--restart", help="an import's id: go on where it stopped"),
    wait: bool = typer.Option(True, help="follow its progress until it ends"),
) -> None:
    """Download a URL, or a Hugging Face-style repository from the server's mirror, into a space, in the server; run
    with --restart ID after a failure to resume."""
    c = client()
    if restart:
        imp = call(c.post, f"/imports/{restart}/restart")
    else:
        target = remote or _default_name(url)
        imp = call(c.post, "/imports", {"url": url, "space": space, "path": target})
    console.print(f"import {imp['id']} into {imp['space']}:{imp['path']}")
    if not wait:
        return
    with _bar(f"import {imp['path']}") as update:
        while imp["state"] == "running":
            update(imp["done_bytes"], imp["total_bytes"] or 0)
            time.sleep(0.5)
            imp = call(c.get, f"/imports/{imp['id']}")
    if imp["state"] != "done":
        failed = [f["path"] for f in imp.get("files", []) if f["state"] == "failed"]
        at = f" ({failed[0]})" if failed else ""
        console.print(f"[red]failed{at}:[/] {imp['error']} (caldera data import --restart {imp['id']} resumes)")
        raise typer.Exit(1)
    files = f"{imp['files_done']} files, " if "files" in imp else ""
    console.print(f"imported {files}{_size(imp['done_bytes'])} to {imp['space']}:{imp['path']}")


def _default_name(url: str) -> str:
    """The URL's file name (before its ?query); a repository's (hf://OWNER/REPO@REV) name (before its @revision)."""
    return url.split("@" if url.startswith("hf://") else "?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
