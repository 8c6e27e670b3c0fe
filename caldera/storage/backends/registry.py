"""The backend named by the setting ``storage_backend``: an entry point of ``caldera.storage_backends`` (a site's
S3 backend is a package declaring one), the built-in local one also when the installed metadata predates it."""

from __future__ import annotations

from importlib.metadata import entry_points

from caldera.config import Settings
from caldera.storage.backends.base import StorageBackend
from caldera.storage.backends.local import LocalBackend

GROUP = "caldera.storage_backends"
BUILT_IN: dict[str, type[StorageBackend]] = {"local": LocalBackend}


def create_backend(settings: Settings) -> StorageBackend:
    for ep in entry_points(group=GROUP):
        if ep.name == settings.storage_backend:
            return ep.load()(settings)
    if settings.storage_backend in BUILT_IN:
        return BUILT_IN[settings.storage_backend](settings)
    names = sorted({ep.name for ep in entry_points(group=GROUP)} | set(BUILT_IN))
    raise ValueError(f"unknown storage backend {settings.storage_backend!r}; installed: {', '.join(names)}")
