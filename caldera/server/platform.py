"""Everything one running Caldera server holds: settings, database, keys, the runtime and the scheduler loop."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import Engine, make_url
from sqlalchemy.orm import Session, sessionmaker

from caldera.config import Settings
from caldera.core.cluster import Node
from caldera.db.engine import make_engine, migrate, session_factory
from caldera.runtime.base import LaunchError, Runtime
from caldera.runtime.default import resolved
from caldera.runtime.local.owner import platform_dir
from caldera.runtime.registry import create_runtime, launched_by
from caldera.server.errors import Unavailable
from caldera.server.queue_positions import QueuePositions
from caldera.server.security import Keys


@dataclass
class Platform:
    settings: Settings
    engine: Engine
    sessions: sessionmaker
    keys: Keys
    runtime: Runtime  # launches new attempts; an attempt launched by another runtime stays with that one
    # One process owns job state: the API and the scheduler loop take this lock around every state change, so a
    # cancel never races a launch.
    state_lock: threading.RLock = field(default_factory=threading.RLock)
    # the queued jobs' places in the scheduler's order at its last cycle, which the API and the portal show
    queue_positions: QueuePositions = field(default_factory=QueuePositions)
    _nodes: list[Node] | None = None
    _other_runtimes: dict[str, Runtime] = field(default_factory=dict)
    _runtimes_lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def create(cls, settings: Settings, runtime: Runtime | None = None) -> Platform:
        settings = resolved(settings)  # the runtime named, where it was auto
        _lay_out_data_dir(settings)
        engine = make_engine(settings.db_url)
        migrate(engine)
        if runtime is None:
            runtime = create_runtime(settings)
        return cls(
            settings, engine, session_factory(engine), Keys.load_or_create(settings.data_dir / "secrets.json"), runtime
        )

    def runtime_of(self, name: str | None, handle: dict | None = None) -> Runtime:
        """The runtime that launched an attempt (``Job.runtime``; for a record from before it was kept, the one
        whose handle it is): re-attach, stop, logs and endpoints go there even when the default changed since.
        Raises Unavailable (502, with the runtime's reason) where that runtime cannot be made here, so an API route
        that reaches it answers with that instead of a 500."""
        name = name or launched_by(handle or {}) or self.runtime.name
        if name == self.runtime.name:
            return self.runtime
        with self._runtimes_lock:
            if name not in self._other_runtimes:
                try:
                    self._other_runtimes[name] = create_runtime(self.settings.model_copy(update={"runtime": name}))
                except LaunchError as exc:
                    raise Unavailable(str(exc), exc.reason, {"runtime": name}) from exc
            return self._other_runtimes[name]

    def session(self) -> Session:
        return self.sessions()

    def nodes(self) -> list[Node]:
        if self._nodes is None:
            self._nodes = self.runtime.nodes()
        return self._nodes

    def refresh_nodes(self) -> None:
        self._nodes = None


def _lay_out_data_dir(settings: Settings) -> None:
    """Jobs run as other uids and may traverse the data directory (to their workspace and scratch), never list
    or read it: the database, the keys and the run directories are the platform's alone."""
    platform_dir(settings.data_dir, 0o711)
    platform_dir(settings.runs_dir, 0o700)
    platform_dir(settings.profiles_dir, 0o700)  # what other users' jobs are and how they ran
    url = make_url(settings.db_url)
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        db = Path(url.database)
        os.close(os.open(db, os.O_WRONLY | os.O_CREAT, 0o600))
        for path in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")):
            if path.exists():
                os.chmod(path, 0o600)  # SQLite gives -wal and -shm the database's mode; older files get it too
