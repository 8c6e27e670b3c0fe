"""What a storage backend gives: for a space, a store with the operations of ``caldera.storage.tree.Tree`` (the
local one), and where the space lies on the hosts' file system for mounts into jobs (None for an object store such
as S3, whose mounts a backend of its own would provide)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

from caldera.storage.spaces import SpaceRef
from caldera.storage.tree import Owner, Tree


class StorageBackend(ABC):
    name: str

    @abstractmethod
    def store(self, ref: SpaceRef, owner: Owner | None) -> Tree:
        """The space's files, its root made when missing; ``owner`` gets what the platform writes there."""

    @abstractmethod
    def host_path(self, ref: SpaceRef) -> Path | None:
        """The space's root on every node's file system (a job's bind mount), or None."""
