"""Appending a large file's bytes past the page cache (``O_DIRECT``), where the file system allows: the server's
upload parts (API chunks, WebDAV PUTs, imports from URL) and the SDK's downloads.

A buffered write of a large upload costs its CPU in the kernel: each page of the page cache it fills is taken from
free memory and zeroed first, and on a virtual machine whose host takes back the memory its guest leaves free
(free page reporting), each such page is a fault on the host too. On the 2-core VM of docs/storage.md this was
most of the server's CPU for a 2 GiB upload (a buffered write of 2 GiB: 1.6 to 4.6 s of system time; ``O_DIRECT``
from a buffer kept: 0.1 s), and the HTTP transfers share those cores with their clients. A direct write also leaves
the page cache to what the node's jobs read, rather than filling it with a dataset nobody reads yet.

Direct writes need the memory, the file offset and the length aligned to the disk's block, so the bytes are staged
in a page-aligned buffer and written a buffer at a time; a head up to the next block boundary and a tail of less
than a block go through the page cache. A file system that refuses ``O_DIRECT`` gets buffered writes throughout."""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import threading
from collections.abc import Iterable

try:
    import fcntl
except ImportError:  # Windows, where the SDK's downloads use this too: no O_DIRECT there
    fcntl = None  # type: ignore[assignment]

_O_DIRECT = getattr(os, "O_DIRECT", 0)  # Linux and the BSDs; not macOS

ALIGN = 4096  # a multiple of every logical block size in use (512 or 4096 bytes)
STAGED = 8 << 20  # bytes staged before a direct write: a multiple of ALIGN
_KEPT = 4  # staging buffers kept for the next writers (their pages stay mapped, so they cost no faults)
_kept: list[mmap.mmap] = []
_kept_lock = threading.Lock()


class DirectWriter:
    """Appends to ``fd`` (open for writing without ``O_DIRECT``, positioned at the end of what it holds). What
    ``write`` was given is in the file once ``flush`` returns; ``close`` flushes and gives the buffer back (the
    descriptor stays open, without ``O_DIRECT`` again)."""

    def __init__(self, fd: int):
        self.fd = fd
        self._position = os.lseek(fd, 0, os.SEEK_CUR)
        self._direct = bool(_O_DIRECT and fcntl)  # until the file system refuses it
        self._flag = False  # O_DIRECT set on fd now
        self._buffer: mmap.mmap | None = None
        self._stage: memoryview | None = None
        self._staged = 0

    def write(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data).cast("B")
        if not self._direct and not self._staged:  # refused (or no O_DIRECT here): no staging either
            self._write_buffered(view)
            return
        if self._position % ALIGN and not self._staged:  # up to the next block boundary, through the page cache
            head = min(len(view), -self._position % ALIGN)
            self._write_buffered(view[:head])
            view = view[head:]
        while view:
            stage = self._staging()
            taken = min(len(view), STAGED - self._staged)
            stage[self._staged : self._staged + taken] = view[:taken]
            self._staged += taken
            view = view[taken:]
            if self._staged == STAGED:
                self.flush()

    def writev(self, pieces: Iterable[bytes | bytearray | memoryview]) -> int:
        """Each piece in order; how many bytes."""
        total = 0
        for piece in pieces:
            self.write(piece)
            total += len(piece)
        return total

    def flush(self) -> None:
        """Write what is staged: the whole blocks directly, the rest through the page cache."""
        if not self._staged:
            return
        staged = self._staging()[: self._staged]
        self._staged = 0  # what a failed write leaves is dropped, with the error
        whole = len(staged) - len(staged) % ALIGN
        done = 0
        while done < whole and self._direct:
            done += self._write_direct(staged[done:whole])
        self._write_buffered(staged[done:])

    def close(self) -> None:
        try:
            self.flush()
        finally:
            if self._flag:
                self._set_direct(False)
            if self._buffer is not None:
                assert self._stage is not None
                self._stage.release()
                _give_back(self._buffer)
                self._buffer = self._stage = None

    def __enter__(self) -> DirectWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _staging(self) -> memoryview:
        if self._stage is None:
            self._buffer = _take()
            self._stage = memoryview(self._buffer)
        return self._stage

    def _write_direct(self, view: memoryview) -> int:
        """Some whole blocks of ``view`` written directly, or all of it through the page cache once the file
        system refuses direct writes (then never tried again); how many bytes."""
        try:
            self._set_direct(True)
            written = os.write(self.fd, view)
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            self._direct = False  # refused before anything was written
            self._write_buffered(view)
            return len(view)
        self._position += written
        if not written or written % ALIGN:  # a short write off a block (the disk filled up): no more direct
            self._direct = False
        return written

    def _write_buffered(self, view: memoryview) -> None:
        self._set_direct(False)
        while view:
            written = os.write(self.fd, view)
            self._position += written
            view = view[written:]

    def _set_direct(self, on: bool) -> None:
        if on != self._flag:
            flags = fcntl.fcntl(self.fd, fcntl.F_GETFL)
            fcntl.fcntl(self.fd, fcntl.F_SETFL, flags | _O_DIRECT if on else flags & ~_O_DIRECT)
            self._flag = on


def _take() -> mmap.mmap:
    with _kept_lock:
        if _kept:
            return _kept.pop()
    return mmap.mmap(-1, STAGED)  # anonymous: page-aligned, as direct writes need


def _give_back(buffer: mmap.mmap) -> None:
    with _kept_lock:
        if len(_kept) < _KEPT:
            _kept.append(buffer)
            return
    with contextlib.suppress(BufferError):  # a slice of it still held (by a traceback): freed with the slice
        buffer.close()
