"""The base image, made on this host (no image registry is reachable from a lab's machines): a minimal Debian tree
from ``debootstrap --variant=minbase`` with python3, imported into podman. The tree's tarball is kept (``cache``),
so a second bootstrap, e.g. on every CI run, only imports it."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from caldera.runtime.container.image import DEFAULT_PATH
from caldera.runtime.container.podman import Podman

DEFAULT_SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEFAULT_PACKAGES = ("python3",)
_DEBOOTSTRAP_TIMEOUT_S = 1800


class BootstrapError(RuntimeError):
    pass


def build_tarball(dest: Path, suite: str, mirror: str, packages: tuple[str, ...], say: Callable[[str], None]) -> None:
    """debootstrap into a temporary directory and pack it as ``dest`` (written aside, then renamed)."""
    if shutil.which("debootstrap") is None:
        raise BootstrapError("debootstrap is not installed (apt-get install debootstrap)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="caldera-base-", dir=dest.parent) as tmp:
        tree = Path(tmp) / "root"
        argv = ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", suite, str(tree), mirror]
        say(" ".join(argv))
        p = subprocess.run(argv, capture_output=True, timeout=_DEBOOTSTRAP_TIMEOUT_S)
        if p.returncode != 0:
            tail = (p.stdout + p.stderr).decode(errors="replace").strip()[-2000:]
            raise BootstrapError(f"debootstrap failed ({p.returncode}): {tail}")
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):  # nothing a job needs, a third of the size
            for entry in (tree / cache).glob("*.deb" if "archives" in cache else "*_*"):
                entry.unlink()
        part = dest.with_name(dest.name + ".part")
        say(f"packing {part.name}")
        subprocess.run(["tar", "-C", str(tree), "-cf", str(part), "."], check=True, timeout=_DEBOOTSTRAP_TIMEOUT_S)
        os.replace(part, dest)


def import_image(podman: Podman, tarball: Path, tag: str) -> str:
    """``podman import`` of the tree, with the PATH and locale a job expects; returns the image id."""
    out = podman.run(
        "import", "--change", f"ENV PATH={DEFAULT_PATH}", "--change", "ENV LANG=C.UTF-8", str(tarball), tag
    )
    return out.strip().splitlines()[-1] if out.strip() else ""


def bootstrap(
    podman: Podman,
    tag: str,
    cache: Path,
    suite: str = DEFAULT_SUITE,
    mirror: str = DEFAULT_MIRROR,
    packages: tuple[str, ...] = DEFAULT_PACKAGES,
    rebuild: bool = False,
    say: Callable[[str], None] = lambda _: None,
) -> str:
    if os.geteuid() != 0:
        raise BootstrapError("run it as root: debootstrap and rootful podman need it")
    if rebuild or not cache.is_file():
        build_tarball(cache, suite, mirror, packages, say)
    else:
        say(f"using {cache} (--rebuild makes it again)")
    say(f"podman import {cache} {tag}")
    return import_image(podman, cache, tag)
