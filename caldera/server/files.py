"""The platform's storage spaces (caldera.storage) composed with what only the server knows: the OS identity a
personal space's files belong to, and a thread that sets the usage counters right now and then."""

from __future__ import annotations

import logging
import threading
import time

from sqlalchemy.orm import Session

from caldera.db.models import User
from caldera.server import identity
from caldera.server.platform import Platform
from caldera.storage.backends.registry import create_backend
from caldera.storage.service import Spaces
from caldera.storage.tree import Owner

log = logging.getLogger(__name__)


def spaces_for(platform: Platform) -> Spaces:
    settings = platform.settings

    def owner_of(db: Session, user: User) -> Owner | None:
        run_as = identity.run_as(settings, db, user)
        db.commit()  # a uid chosen now is kept
        return None if run_as is None else Owner(run_as.uid, run_as.gid)

    return Spaces(settings, create_backend(settings), owner_of)


class Reconciler:
    """Walks the spaces whose counters are older than ``storage_reconcile_s``, in a thread of its own."""

    def __init__(self, platform: Platform, spaces: Spaces, period_s: float = 60.0):
        self.platform, self.spaces, self.period_s = platform, spaces, period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="storage-reconciler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                with self.platform.session() as db:
                    self.spaces.reconcile_due(db, time.time())
            except Exception:  # noqa: BLE001 - a space that cannot be walked now is walked next time
                log.exception("storage reconciliation failed")
