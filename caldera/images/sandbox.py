"""Where builds run: rootless buildah as the unprivileged build user, in a user namespace of its own subordinate ids,
with image storage of its own. A builder bug that mounts a host path into a build (CVE-2024-9675: a cache mount's
``id=../..``, in Debian's buildah 1.28) then reaches only what that user may reach, never host root; the form
refuses such lines too (form.py), this is the second wall.

Layout (``data_dir`` is 0711, so the build user passes it but lists nothing in it):

    builder/                 0711 root
      config/                0700 build user: HOME, made afresh for each build and push, so that no build
                             leaves a containers.conf or registries.conf for the next one
      home/                  0700 build user: image storage, TMPDIR
      contexts/<image_id>/   0700 build user: one build's Containerfile, written by root without following links
      bases/                 0750 root, group of the build user: a base image handed over as an archive
      auth.json              0600 build user, only during a push: the platform's registry login
    /run/caldera-build/      0711 root
      <hash of data_dir>/    0700 build user: XDG_RUNTIME_DIR and storage state (podman wants that path short)

Nothing here starts as root with a value a user chose: root tools (podman, buildah for snapshots) get ``ROOT_ENV``,
the build user's tools ``env()``; both fixed."""

from __future__ import annotations

import hashlib
import os
import pwd
import shutil
import stat
import subprocess
from contextlib import contextmanager
from pathlib import Path

from caldera.runtime.base import RunAs
from caldera.runtime.local.launchfile import ROOT_PATH
from caldera.runtime.local.owner import owned_dir, platform_dir, write_owned

BUILD_USER = "caldera-build"
SUBIDS = (1_000_000_000, 65536)  # first subordinate id, count: far above any account's uid
ROOT_ENV = {"PATH": ROOT_PATH, "LC_ALL": "C", "HOME": "/root"}
RUNTIME_ROOT = Path("/run/caldera-build")
TUN = Path("/dev/net/tun")  # slirp4netns gives the build its own network through it


class SandboxUnavailable(RuntimeError):
    """Why builds cannot run rootless here; the platform then builds nothing rather than build as root."""


def _run(argv: list[str]) -> None:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=ROOT_ENV)
    if r.returncode != 0:
        raise SandboxUnavailable(f"{' '.join(argv[:2])} failed: {r.stderr.strip()[-500:]}")


def ensure_user() -> RunAs:
    """The build user (a system account without login or home), created once."""
    try:
        entry = pwd.getpwnam(BUILD_USER)
    except KeyError:
        _run(["useradd", "--system", "-M", "-U", "-d", "/nonexistent", "-s", "/usr/sbin/nologin", BUILD_USER])
        entry = pwd.getpwnam(BUILD_USER)
    return RunAs(entry.pw_name, entry.pw_uid, entry.pw_gid)


def _subid_ranges(path: str) -> dict[str, tuple[int, int]]:
    try:
        lines = Path(path).read_text().splitlines()
    except FileNotFoundError:
        return {}
    ranges = {}
    for line in lines:
        parts = line.split(":")
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            ranges[parts[0]] = (int(parts[1]), int(parts[2]))
    return ranges


def ensure_subids() -> None:
    """Subordinate uids and gids for the build user's namespace, in a range no other entry uses."""
    files = ("/etc/subuid", "/etc/subgid")
    if all(BUILD_USER in _subid_ranges(f) for f in files):
        return
    first = max([SUBIDS[0], *(s + n for f in files for s, n in _subid_ranges(f).values())])
    span = f"{first}-{first + SUBIDS[1] - 1}"
    _run(["usermod", "--add-subuids", span, "--add-subgids", span, BUILD_USER])


def ensure_tun(user: RunAs) -> None:
    """slirp4netns opens /dev/net/tun as the build user: udev makes it 0666; without udev it is root's 0600, then
    the build user's group gets it (nobody else)."""
    st = os.stat(TUN)
    if st.st_mode & 0o006 == 0o006 or (st.st_gid == user.gid and st.st_mode & 0o060 == 0o060):
        return
    if st.st_gid != 0:
        raise SandboxUnavailable(f"{TUN} belongs to group {st.st_gid}; make it 0666 (as udev does)")
    os.chown(TUN, -1, user.gid)
    os.chmod(TUN, stat.S_IMODE(st.st_mode) | 0o060)


def storage_driver() -> str:
    """overlay where the kernel mounts it in a user namespace (5.13 and later), else vfs (copies, slower)."""
    major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    return "overlay" if (major, minor) >= (5, 13) else "vfs"


class Sandbox:
    def __init__(self, data_dir: Path):
        self.root = data_dir / "builder"
        self.home = self.root / "home"
        self.runtime = RUNTIME_ROOT / hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:12]
        self.user: RunAs | None = None

    def prepare(self) -> RunAs:
        """Idempotent: the user, its ids, the network device and the directories; SandboxUnavailable says why not."""
        for tool, package in (("newuidmap", "uidmap"), ("newgidmap", "uidmap"), ("slirp4netns", "slirp4netns")):
            if shutil.which(tool, path=ROOT_PATH) is None:
                raise SandboxUnavailable(f"builds run rootless and need {tool}: apt-get install {package}")
        if not TUN.exists():
            raise SandboxUnavailable(f"builds run rootless and need {TUN} (the tun module)")
        user = ensure_user()
        ensure_subids()
        ensure_tun(user)
        platform_dir(self.root, 0o711)
        platform_dir(self.root / "contexts", 0o711)
        platform_dir(self.root / "bases", 0o750)
        os.chown(self.root / "bases", 0, user.gid)
        owned_dir(self.home, user)
        for sub in ("tmp", "storage"):
            owned_dir(self.home / sub, user)
        platform_dir(RUNTIME_ROOT, 0o711)
        owned_dir(self.runtime, user)
        self.user = user
        self.fresh_config()
        return user

    def fresh_config(self) -> None:
        owned_dir(self.root / "config", self.user or self.prepare(), fresh=True)

    def env(self) -> dict[str, str]:
        config = str(self.root / "config")
        return {
            "PATH": ROOT_PATH,
            "LC_ALL": "C",
            "HOME": config,
            "XDG_CONFIG_HOME": config,
            "XDG_RUNTIME_DIR": str(self.runtime),
            "TMPDIR": str(self.home / "tmp"),
        }

    def argv(self, tool: str) -> list[str]:
        """``tool`` (buildah or podman) as the build user on its own storage."""
        u = self.user or self.prepare()
        return [
            "setpriv",
            f"--reuid={u.uid}",
            f"--regid={u.gid}",
            "--clear-groups",
            "--",
            tool,
            "--root",
            str(self.home / "storage"),
            "--runroot",
            str(self.runtime / "storage"),
            "--storage-driver",
            storage_driver(),
        ]

    def context(self, name: str, containerfile: str) -> Path:
        """A fresh build context holding only the Containerfile."""
        u = self.user or self.prepare()
        ctx = owned_dir(self.root / "contexts" / name, u, fresh=True)
        write_owned(ctx / "Containerfile", containerfile, u)
        return ctx

    def base_archive(self, name: str) -> Path:
        return self.root / "bases" / f"{name}.tar"

    @contextmanager
    def authfile(self, text: str | None):
        """The registry login for one push, readable by the build user only, gone afterwards."""
        if text is None:
            yield None
            return
        u = self.user or self.prepare()
        path = self.root / "auth.json"
        write_owned(path, text, u)
        try:
            yield path
        finally:
            path.unlink(missing_ok=True)
