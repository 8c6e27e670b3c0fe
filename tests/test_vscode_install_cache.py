"""scripts/install-code-server keeps its installation only while it is what the script would install now: the
version, the code-server tarball's integrity and the lock file, and npm's record of the installed tree naming that
tarball. Checked on a stand-in tree, with a PATH on which an install would stop at once (no Node headers)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent.parent / "scripts" / "install-code-server"
LOCK = SCRIPT.parent / "code-server" / "package-lock.json"


def _kept(dest: Path, bin_dir: Path) -> bool:
    """True when the script kept ``dest``; False when it went on to install (and stopped: no Node headers)."""
    run = subprocess.run(["bash", str(SCRIPT), str(dest)], env={"PATH": str(bin_dir)}, capture_output=True, text=True)
    assert run.returncode == 0 or "no Node headers" in run.stderr, run.stderr
    return run.returncode == 0


def test_the_cache_is_keyed_on_the_version_and_the_tarball_s_integrity(tmp_path) -> None:
    if shutil.which("node") is None:
        pytest.skip("no node")
    bin_dir = tmp_path / "bin"  # what the script's check needs; node's headers are not beside it
    bin_dir.mkdir()
    for tool in ("node", "bash", "dirname", "realpath", "sha256sum", "cut", "cat", "mktemp", "rm"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    lock = json.loads(LOCK.read_text())
    pinned = lock["packages"]["node_modules/code-server"]
    dest = tmp_path / "code-server"
    (dest / "node_modules" / ".bin").mkdir(parents=True)
    (dest / "node_modules" / ".bin" / "code-server").write_text("#!/bin/sh\n")
    os.chmod(dest / "node_modules" / ".bin" / "code-server", 0o755)
    (dest / "node_modules" / "code-server" / "out" / "node").mkdir(parents=True)
    (dest / "node_modules" / "code-server" / "out" / "node" / "entry.js").write_text("")
    installed = {"packages": {"node_modules/code-server": {"version": pinned["version"], "integrity": ""}}}

    def tree(integrity: str) -> None:
        installed["packages"]["node_modules/code-server"]["integrity"] = integrity
        (dest / "node_modules" / ".package-lock.json").write_text(json.dumps(installed))

    key = f"{pinned['version']} {pinned['integrity']} {hashlib.sha256(LOCK.read_bytes()).hexdigest()}\n"
    (dest / ".installed").write_text(key)
    tree(pinned["integrity"])
    assert _kept(dest, bin_dir)

    (dest / ".installed").write_text(f"{pinned['version']}\n")  # the version alone (as the script once kept it)
    assert not _kept(dest, bin_dir)
    (dest / ".installed").write_text(key)
    tree("sha512-" + "A" * 86 + "==")  # a tree from another tarball, under the right key
    assert not _kept(dest, bin_dir)
    (dest / "node_modules" / ".package-lock.json").unlink()  # an install cut short
    assert not _kept(dest, bin_dir)
