"""Layout of one job attempt's run directory, shared by the runtime and the supervisor shim.

Everything needed to find a job again after the server restarts is a file here, written atomically
(temporary file + rename) so a reader never sees half a record:

    meta.json           what the runtime launched (kind, ranks with shim pid + start time, jupyter port)
    rank-<r>.launch.json  0600, what rank r runs (command, environment, uid): read and removed by its shim
    rank-<r>.log        stdout+stderr of rank r (the shim's too: it only writes there if it cannot start the command)
    rank-<r>.pid        written by rank r's shim: its pid and start time, then the command's
    rank-<r>.exit       written by rank r's shim when the command ended: exit code, signal, time
    stop.json           a stop was requested: when, and when SIGKILL follows (the shims read it on SIGTERM)
    gang-failure.json   first failing rank of a distributed job (created exclusively: first writer wins)
    jupyter.token       0600, the platform's copy of the Jupyter token (never in meta.json or a log)
    lab.sock            a hard link to Lab's socket, the one path the platform connects to it by

The job itself never sees this directory (it is root's, 0700): what it may read lives in its scratch directory.

Standard library only (imported by the shim).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json_atomic(path: Path, obj: Any, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())  # an exit record must survive a host crash as well as a server crash
    os.replace(tmp, path)


def write_text_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def create_json_exclusive(path: Path, obj: Any) -> bool:
    """Write ``obj`` to ``path`` only if nobody did yet (write aside, then hard-link: atomic and exclusive)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    write_json_atomic(tmp, obj)
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


class RunDir:
    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)

    def launch(self, rank: int) -> Path:
        return self.path / f"rank-{rank}.launch.json"

    def log(self, rank: int) -> Path:
        return self.path / f"rank-{rank}.log"

    def pidfile(self, rank: int) -> Path:
        return self.path / f"rank-{rank}.pid"

    def exitfile(self, rank: int) -> Path:
        return self.path / f"rank-{rank}.exit"

    @property
    def meta(self) -> Path:
        return self.path / "meta.json"

    @property
    def stop(self) -> Path:
        return self.path / "stop.json"

    @property
    def gang_failure(self) -> Path:
        return self.path / "gang-failure.json"

    @property
    def lab_socket(self) -> Path:
        return self.path / "lab.sock"

    @property
    def token(self) -> Path:
        return self.path / "jupyter.token"

    def kill_deadline(self) -> float | None:
        """The earliest SIGKILL time anyone asked for, or None."""
        times = [
            rec["kill_at"]
            for rec in (read_json(self.stop), read_json(self.gang_failure))
            if rec and rec.get("kill_at") is not None
        ]
        return min(times) if times else None
