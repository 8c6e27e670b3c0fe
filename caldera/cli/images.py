"""`caldera images`: the container images jobs run in."""

from __future__ import annotations

from pathlib import Path

import typer

from caldera.cli.common import call, client, console, err
from caldera.cli.output import OUTPUT, Format, emit
from caldera.images.form import CUDA, CUDNN, PYTHONS
from caldera.images.ready import DEFAULT_READY, READY

images_app = typer.Typer(help="Container images jobs run in.", no_args_is_help=True)


@images_app.command()
def bootstrap(
    tag: str | None = typer.Option(None, help="image name (the container runtime's default image)"),
    cache: Path = typer.Option(
        None, help="the Debian tree's tarball, kept for reuse (/var/cache/caldera-base[-<suite>].tar)"
    ),
    suite: str = typer.Option("bookworm", help="Debian release: bookworm has Python 3.11, trixie 3.13"),
    mirror: str = typer.Option("http://deb.debian.org/debian", help="Debian mirror"),
    include: list[str] = typer.Option([], help="more Debian packages in the image (python3 always is)"),
    rebuild: bool = typer.Option(False, help="run debootstrap again even if the tarball exists"),
    ready: list[str] = typer.Option(
        list(DEFAULT_READY),
        "--ready",
        help=f"ready environments to build on the base ({', '.join(READY)}; 'none' for only the base): "
        "caldera/<name>:<suite>, default is the container runtime's default image",
    ),
) -> None:
    """Make the base image on this host (debootstrap --variant=minbase with python3, imported into podman: no image
    registry needed, about a minute) and the ready environments on it (caldera/default:<suite> with JupyterLab;
    --ready pytorch adds caldera/pytorch:<suite>), showing each build step."""
    from caldera.images import ready as ready_images
    from caldera.runtime.container import bootstrap as boot
    from caldera.runtime.container.podman import Podman, PodmanError
    from caldera.runtime.container.settings import ContainerSettings

    cs = ContainerSettings()
    # one base per release, named as the build form looks for it (caldera/base:trixie for Python 3.13)
    tag = tag or ready_images.base_tag(suite)
    cache = cache or Path(
        "/var/cache/caldera-base.tar" if suite == "bookworm" else f"/var/cache/caldera-base-{suite}.tar"
    )
    podman = Podman(cs.global_args(), str(cs.conf) if cs.conf else None, timeout_s=1800)
    packages = tuple(dict.fromkeys([*boot.DEFAULT_PACKAGES, *include]))
    try:
        image_id = boot.bootstrap(
            podman, tag, cache, suite, mirror, packages, rebuild, say=lambda m: console.print(f"  {m}")
        )
    except (boot.BootstrapError, PodmanError, OSError) as exc:
        err.print(f"[red]cannot make the base image:[/red] {exc}")
        raise typer.Exit(1) from None
    console.print(f"[bold green]{tag}[/bold green] {image_id.removeprefix('sha256:')[:12]}")
    unknown = [r for r in ready if r not in READY and r != "none"]
    if unknown:
        err.print(f"[red]no ready environment {', '.join(unknown)}[/red] (choose from {', '.join(READY)})")
        raise typer.Exit(2)
    for name in dict.fromkeys(r for r in ready if r != "none"):
        console.print(f"building {READY[name].tag(suite)}: {READY[name].inside}")
        try:
            built = ready_images.build(podman, READY[name], suite, say=lambda m: console.print(f"  {m}"))
        except (ready_images.ReadyBuildFailed, OSError) as exc:
            err.print(f"[red]cannot build it:[/red] {exc}")
            raise typer.Exit(1) from None
        console.print(f"[bold green]{built}[/bold green]")


def _api(method: str, path: str, *args):
    return call(getattr(client(), method), path, *args)


def _follow(image_id: str) -> None:
    call(_copy_to_stdout, client().stream(f"/images/{image_id}/log", follow="true"))


def _copy_to_stdout(chunks) -> None:
    import sys

    for chunk in chunks:
        sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()


@images_app.command()
def build(
    name: str = typer.Argument(..., help="image name (lower case, digits, . _ -)"),
    tag: str = typer.Option("latest"),
    visibility: str = typer.Option("private", help="private, account or public"),
    account: str | None = typer.Option(None, help="the account of an account image"),
    python: str = typer.Option("3.11", help=f"{', '.join(PYTHONS)} (a base image each: `caldera images environments`)"),
    base: str | None = typer.Option(
        None, help="build on this base (its Python wins): an environment or an image id of `GET /images/bases`"
    ),
    cuda: str = typer.Option("none", help=f"{', '.join(CUDA)} (pip wheels)"),
    cudnn: str = typer.Option("none", help=f"{', '.join(CUDNN)} (pip wheels; 8.x needs CUDA 11, 9.x CUDA 12)"),
    jupyter: bool = typer.Option(False, help="install JupyterLab"),
    vscode: bool = typer.Option(False, help="install code-server, for vscode jobs (VS Code in the browser)"),
    ssh: bool = typer.Option(False, help="install OpenSSH's server, for `caldera ssh` into jobs"),
    pip: list[str] = typer.Option([], help="a pip requirement (repeat)"),
    apt: list[str] = typer.Option([], help="a Debian package (repeat)"),
    line: list[str] = typer.Option([], help="an extra RUN/ENV/WORKDIR/LABEL line (repeat)"),
    follow: bool = typer.Option(True, help="print the build's log until it ends; exit 1 if it failed"),
) -> None:
    """Build an image from a form on the platform (queued), push it to the registry and record it."""
    form = {
        "name": name, "tag": tag, "visibility": visibility, "account": account, "python": python, "cuda": cuda,
        "cudnn": cudnn, "base": base, "jupyter": jupyter, "vscode": vscode, "ssh": ssh, "pip": pip,
        "apt": apt, "extra_lines": line,
    }  # fmt: skip
    img = _api("post", "/images", form)
    console.print(f"build [bold]{img['id']}[/bold] of {img['reference']} queued")
    if not follow:
        return
    _follow(img["id"])
    img = _api("get", f"/images/{img['id']}")
    if img["state"] != "ready":
        err.print(f"[red]build failed:[/red] {img['message']}")
        raise typer.Exit(1)
    console.print(f"[bold green]{img['reference']}[/bold green] {img['size_bytes'] / (1 << 20):.0f} MiB")


@images_app.command("list")
def list_images(output: Format = OUTPUT) -> None:
    """Images I may run (and my own builds in any state)."""
    emit(_api("get", "/images"), output, _images_table)


def _images_table(rows: list[dict]) -> None:
    from rich.table import Table

    t = Table("ID", "REFERENCE", "OWNER", "VISIBILITY", "STATE", "SIZE", "MESSAGE")
    for i in rows:
        size = f"{i['size_bytes'] / (1 << 20):.0f} MiB" if i["size_bytes"] else "-"
        t.add_row(i["id"], i["reference"], i["owner"], i["visibility"], i["state"], size, i["message"][:60])
    console.print(t)


@images_app.command()
def snapshot(
    job_id: str = typer.Argument(..., help="a running job of yours (id or unique prefix)"),
    name: str = typer.Option("session", help="image name"),
    tag: str | None = typer.Option(None, help="snap-<UTC time> when omitted"),
    follow: bool = typer.Option(True, help="print the snapshot's log until it ends"),
) -> None:
    """Save a running job's container as an image of yours."""
    from caldera.client import Client

    form = {"tag": tag} if tag else {}
    img = call(Client.from_config().snapshot, job_id, name, **form)
    console.print(f"snapshot [bold]{img['id']}[/bold] of {img['reference']} queued")
    if follow:
        _follow(img["id"])


@images_app.command()
def delete(image_id: str) -> None:
    """Delete an image of mine from the registry and the catalogue."""
    _api("delete", f"/images/{image_id}")
    console.print(f"deleted {image_id}")


@images_app.command()
def quota(username: str, set_mib: int | None = typer.Option(None, "--set", help="new quota in MiB (admins)")) -> None:
    """Show a user's image quota, or set it (admins only)."""
    if set_mib is not None:
        _api("put", f"/images/quotas/{username}", {"quota_mib": set_mib})
    q = _api("get", f"/images/quotas/{username}")
    console.print(f"{username}: {q['used_mib']:.0f} MiB used of {q['quota_mib']} MiB")


environments_app = typer.Typer(help="The catalogue of ready environments and base images (admins curate it).")
images_app.add_typer(environments_app, name="environments")


@environments_app.callback(invoke_without_command=True)
def environments_list(ctx: typer.Context) -> None:
    """The catalogue: ready environments jobs run in and base images builds start from."""
    if ctx.invoked_subcommand is not None:
        return
    from rich.table import Table

    table = Table("image", "kind", "python", "cuda", "inside", "here")
    for e in _api("get", "/images/environments"):
        here = "yes" if e["present"] else f"no: {e['makes_it']}"
        table.add_row(e["ref"], e["kind"], e["python"], e["cuda"], e["inside"], here)
    console.print(table)


@environments_app.command("add")
def environments_add(
    ref: str = typer.Argument(..., help="a platform image on every node, caldera/<name>:<tag>"),
    kind: str = typer.Option("ready", help="ready (jobs run in it) or base (builds start from it)"),
    python: str = typer.Option(..., help="its Python version, e.g. 3.11"),
    cuda: str = typer.Option("none", help="its CUDA version, e.g. 12.x, or none"),
    inside: str = typer.Option("", help="what is inside, as users read it"),
) -> None:
    """Add an image to the catalogue (admins)."""
    e = _api("post", "/images/environments", {"ref": ref, "kind": kind, "python": python, "cuda": cuda,
                                               "inside": inside})  # fmt: skip
    console.print(f"added [bold]{e['ref']}[/bold]" + ("" if e["present"] else f" (not on this host: {e['makes_it']})"))


@environments_app.command("remove")
def environments_remove(ref: str) -> None:
    """Take an image out of the catalogue (admins); the image itself stays on the nodes."""
    _api("delete", f"/images/environments/{ref}")
    console.print(f"removed {ref}")
