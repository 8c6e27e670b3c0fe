"""`caldera images`: the container images jobs run in."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

images_app = typer.Typer(help="Container images jobs run in.", no_args_is_help=True)
console = Console()
err = Console(stderr=True)


@images_app.command()
def bootstrap(
    tag: str | None = typer.Option(None, help="image name (the container runtime's default image)"),
    cache: Path = typer.Option(Path("/var/cache/caldera-base.tar"), help="the Debian tree's tarball, kept for reuse"),
    suite: str = typer.Option("bookworm", help="Debian release"),
    mirror: str = typer.Option("http://deb.debian.org/debian", help="Debian mirror"),
    include: list[str] = typer.Option([], help="more Debian packages in the image (python3 always is)"),
    rebuild: bool = typer.Option(False, help="run debootstrap again even if the tarball exists"),
) -> None:
    """Make the base image on this host: debootstrap --variant=minbase with python3, imported into podman
    (a one-time step, about a minute; no image registry needed)."""
    from caldera.runtime.container import bootstrap as boot
    from caldera.runtime.container.podman import Podman, PodmanError
    from caldera.runtime.container.settings import ContainerSettings

    cs = ContainerSettings()
    podman = Podman(cs.global_args(), str(cs.conf) if cs.conf else None, timeout_s=1800)
    packages = tuple(dict.fromkeys([*boot.DEFAULT_PACKAGES, *include]))
    try:
        image_id = boot.bootstrap(
            podman, tag or cs.image, cache, suite, mirror, packages, rebuild, say=lambda m: console.print(f"  {m}")
        )
    except (boot.BootstrapError, PodmanError, OSError) as exc:
        err.print(f"[red]cannot make the base image:[/red] {exc}")
        raise typer.Exit(1) from None
    console.print(f"[bold green]{tag or cs.image}[/bold green] {image_id.removeprefix('sha256:')[:12]}")
