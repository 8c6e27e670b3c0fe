"""DirectWriter: an upload's bytes appended past the page cache, whole blocks directly, the edges buffered."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import random

import pytest

from caldera.storage import direct_writer
from caldera.storage.direct_writer import ALIGN, STAGED, DirectWriter

_libc = ctypes.CDLL(None, use_errno=True)
_CACHESTAT = 451  # Linux 6.5: how many of a file's pages the page cache holds


class _Range(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Stat(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in ("cache", "dirty", "writeback", "evicted", "recently_evicted")]


def cached_pages(fd: int) -> int:
    stat = _Stat()
    if _libc.syscall(_CACHESTAT, fd, ctypes.byref(_Range(0, 0)), ctypes.byref(stat), 0) != 0:
        pytest.skip(f"cachestat: {os.strerror(ctypes.get_errno())}")
    return stat.cache


def append(path, offset: int, pieces) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        os.lseek(fd, offset, os.SEEK_SET)
        with DirectWriter(fd) as part:
            assert part.writev(pieces) == sum(map(len, pieces))
    finally:
        os.close(fd)


def test_pieces_of_any_size_from_any_offset_land_in_order(tmp_path):
    rng = random.Random(7)
    path, expected = tmp_path / "part", bytearray()
    for _ in range(6):  # each call resumes where the last stopped, mostly off a block boundary
        pieces = [rng.randbytes(rng.choice((1, 100, ALIGN - 1, ALIGN, 65_537, 3 << 20))) for _ in range(9)]
        append(path, len(expected), pieces)
        expected += b"".join(pieces)
        assert path.read_bytes() == expected


def direct_writes_taken(folder) -> bool:
    """Whether the file system of ``folder`` takes O_DIRECT (tmpfs before Linux 6.6 does not)."""
    probe = folder / "probe"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT)
    except OSError:
        return False
    try:
        with mmap.mmap(-1, ALIGN) as block:
            os.write(fd, block)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
        probe.unlink()


def test_whole_blocks_go_past_the_page_cache(tmp_path):
    if not direct_writes_taken(tmp_path):
        pytest.skip("this file system refuses O_DIRECT")
    path = tmp_path / "part"
    data = os.urandom(2 * STAGED + ALIGN + 10)
    append(path, 0, [data[: ALIGN + 5], data[ALIGN + 5 :]])
    fd = os.open(path, os.O_RDONLY)
    try:
        # the tail of 10 bytes went through the page cache; a buffered write would have left 4,098 pages there
        assert cached_pages(fd) <= 1
    finally:
        os.close(fd)
    assert path.read_bytes() == data
    plain = tmp_path / "plain"
    plain.write_bytes(data)
    fd = os.open(plain, os.O_RDONLY)
    try:
        assert cached_pages(fd) > (2 * STAGED) // os.sysconf("SC_PAGE_SIZE") // 2  # the measure sees them
    finally:
        os.close(fd)


def test_a_file_system_that_refuses_direct_writes_gets_buffered_ones(tmp_path, monkeypatch):
    """tmpfs before Linux 6.6 and some FUSE file systems answer O_DIRECT with EINVAL, before writing anything."""
    real_write, direct_tries = os.write, []

    def refusing_write(fd, data):
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            direct_tries.append(len(data))
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(fd, data)

    monkeypatch.setattr(direct_writer.os, "write", refusing_write)
    data = os.urandom(3 * STAGED + 123)
    append(tmp_path / "part", 0, [data[:1000], data[1000:]])
    assert (tmp_path / "part").read_bytes() == data
    assert direct_tries == [STAGED]  # tried once, then never again


def test_what_was_written_before_an_error_is_kept(tmp_path):
    path = tmp_path / "part"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        with pytest.raises(ConnectionResetError), DirectWriter(fd) as part:
            part.write(b"x" * (ALIGN + 7))
            raise ConnectionResetError("the client went away")
        assert not fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT  # left as found
    finally:
        os.close(fd)
    assert path.read_bytes() == b"x" * (ALIGN + 7)
