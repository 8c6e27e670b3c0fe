"""The podman CLI, the one way this runtime talks to podman: each call is a short-lived process, so nothing is
held open across a server restart, and conmon (podman's per-container monitor) keeps containers and their logs
going while no server runs."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Any

_MAX_ERR = 2000


class PodmanError(RuntimeError):
    def __init__(self, argv: list[str], code: int, stderr: str):
        self.code = code
        self.stderr = stderr.strip()[-_MAX_ERR:]
        super().__init__(f"podman {argv[0] if argv else ''} failed ({code}): {self.stderr}")


def private_dir(path: Path) -> Path:
    """``path`` as a directory only this uid can use; where something else stands there (in a shared /tmp, a job
    may have planted a symlink or a directory of its own), a fresh private one instead."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077:
        return path
    return Path(tempfile.mkdtemp(prefix=f"{path.name}-"))


class Podman:
    def __init__(self, global_args: list[str], conf: str | None = None, timeout_s: float = 120.0):
        self.base = list(global_args)
        # podman, conmon and the OCI runtime run as root and inherit this: a fixed environment, never a job's
        # (a job's values reach its container only through files, see envfile)
        self.env = {"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "LC_ALL": "C"}
        if conf:
            self.env["CONTAINERS_CONF"] = conf
        self.timeout_s = timeout_s
        # conmon leaves files (an empty `oom` after an out-of-memory kill) in the directory it was started from:
        # a private one of ours, not whatever the server's working directory is
        self.cwd = private_dir(Path(tempfile.gettempdir()) / f"caldera-podman-{os.getuid()}")

    def run(self, *argv: str, check: bool = True) -> str:
        try:
            p = subprocess.run(
                [*self.base, *argv],
                capture_output=True,
                env=self.env,
                timeout=self.timeout_s,
                cwd=self.cwd,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PodmanError(list(argv), -1, str(exc)) from None
        if check and p.returncode != 0:
            raise PodmanError(list(argv), p.returncode, p.stderr.decode(errors="replace"))
        return p.stdout.decode(errors="replace")

    def detached(self, *argv: str) -> None:
        """Starts a podman command that outlives this process (a stop whose SIGKILL must come even if the server
        dies meanwhile); its exit is nobody's business."""
        subprocess.Popen(
            [*self.base, *argv],
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            cwd=self.cwd,
        )

    def image_exists(self, image: str) -> bool:
        return (
            subprocess.run(
                [*self.base, "image", "exists", image],
                env=self.env,
                capture_output=True,
                timeout=self.timeout_s,
                cwd=self.cwd,
            ).returncode
            == 0
        )

    def containers(self, *labels: str) -> list[dict[str, Any]]:
        """Every container (running or not) carrying all ``labels`` (``key=value``)."""
        filters = [a for lab in labels for a in ("--filter", f"label={lab}")]
        out = self.run("ps", "-a", "--no-trunc", *filters, "--format", "json")
        return json.loads(out or "[]") or []
