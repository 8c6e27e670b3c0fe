"""The one channel from the runtime to a rank's root supervisor, and the environment of every root process.

Nothing a user controls reaches a root process except as data read from here: the runtime writes what the rank runs
(command, environment, working directory, uid) as JSON to ``rank-<r>.launch.json`` in the root-only run directory
(0600), and starts the supervisor -- and every other root helper (nsenter, the network namespace holder) -- with
``root_env()``, a fixed environment built from constants. The supervisor's Python runs isolated (``-I``: no
``PYTHON*`` variable, user site or working directory alters it) and hands the job's environment to the command only
at its final exec, after dropping privileges.

Standard library only (imported by the shim).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from caldera.runtime.local.procs import TAG_VAR
from caldera.runtime.local.rundir import RunDir, write_json_atomic

# where root processes the platform starts look for programs: a constant, never the environment of a request
ROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def root_env(tag: str | None = None) -> dict[str, str]:
    """The whole environment of a root process the runtime starts. The run tag is the platform's (job id, attempt,
    rank): it lets the runtime find a rank's supervisor among leftovers."""
    env = {"PATH": ROOT_PATH, "LANG": "C.UTF-8"}
    if tag is not None:
        env[TAG_VAR] = tag
    return env


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    env: dict[str, str]
    workdir: str
    tag: str
    world_size: int = 1
    gang_grace_s: float = 10.0
    uid: int | None = None
    gid: int | None = None
    private_tmp: str | None = None  # the job's own /tmp (a directory of its scratch); set: own PID + mount namespace
    keep: tuple[str, ...] = ()  # the job's own directories, kept in view if they lie below /tmp
    mounts: tuple[tuple[str, str, bool], ...] = ()  # storage spaces: (host path, path in the job, writable)


def write(rd: RunDir, rank: int, launch: Launch) -> None:
    write_json_atomic(rd.launch(rank), asdict(launch), mode=0o600)


def read(rd: RunDir, rank: int) -> Launch:
    """The rank's launch, removed once read: it holds the job's environment, which may carry the user's secrets."""
    path: Path = rd.launch(rank)
    with open(path) as f:
        data = json.load(f)
    os.unlink(path)
    mounts = tuple((str(h), str(a), bool(w)) for h, a, w in data.get("mounts", ()))
    return Launch(**{**data, "keep": tuple(data.get("keep", ())), "mounts": mounts})
