"""A space's directory on a local or shared file system, reached only through descriptors.

A job may have planted a symbolic link anywhere it can write, and may swap a folder for a link between two of our
calls. So every operation opens the space's root, then each name below it with ``O_NOFOLLOW`` relative to the
descriptor of its parent (openat), and acts on the last name through the parent's descriptor too: a link on the
way is refused, a link at the end is listed, moved or deleted as the link it is, never read or written through.
Creating never replaces (``O_EXCL``, ``renameat2(RENAME_NOREPLACE)``), so a name clash is an error.

In a personal space, files and folders the platform makes are given to the owner's uid; a file is read only when
that uid owns it, so a hard link a job made to a file it does not own is not served either.
"""

from __future__ import annotations

import ctypes
import errno
import heapq
import os
import shutil
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import BinaryIO

from caldera.storage.direct_writer import DirectWriter
from caldera.storage.errors import NameClash, NoSuchPath, PathRefused, QuotaExceeded

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_RENAME_NOREPLACE = 1
_MAX_COPY_DEPTH = 256  # a job can nest folders deeper than Python's recursion goes
MAX_LEFT_OUT_SHOWN = 100
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class Entry:
    name: str
    kind: str  # file, dir, link (never followed) or other (a socket, a FIFO, a device)
    size: int
    modified: float


@dataclass
class Copied:
    """What ``Tree.copy_folder`` copied, and the first entries it left out, each with why."""

    size: int = 0
    files: int = 0
    left_out: list[str] = field(default_factory=list)

    def leave_out(self, path: str, why: str) -> None:
        if len(self.left_out) < MAX_LEFT_OUT_SHOWN:
            self.left_out.append(f"{path}: {why}")


@dataclass(frozen=True)
class Owner:
    """The uid and gid that own what the platform writes in a space (a personal space's owner); None: root's."""

    uid: int
    gid: int


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "link"
    return "other"


def _entry(name: str, st: os.stat_result) -> Entry:
    return Entry(name, _kind(st.st_mode), st.st_size if stat.S_ISREG(st.st_mode) else 0, st.st_mtime)


def _rename_noreplace(src_dir: int, src: str, dst_dir: int, dst: str) -> None:
    ret = _libc.renameat2(src_dir, src.encode(), dst_dir, dst.encode(), _RENAME_NOREPLACE)
    if ret != 0:
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            raise NameClash(f"{dst!r} already exists")
        raise OSError(err, os.strerror(err))


class Tree:
    def __init__(
        self, root: str, uploads: str, owner: Owner | None = None, dir_mode: int = 0o755, file_mode: int = 0o644
    ):
        self.root, self.uploads, self.owner = root, uploads, owner
        self.dir_mode, self.file_mode = dir_mode, file_mode

    # -- reaching a folder -------------------------------------------------------------------------------------

    @contextmanager
    def folder(self, names: tuple[str, ...], create: bool = False) -> Iterator[int]:
        """A descriptor of the folder ``names`` below the root, each step without following a link. With
        ``create``, missing folders are made (the owner's)."""
        fd = os.open(self.root, _DIR_FLAGS)
        try:
            for name in names:
                if create:
                    try:
                        self._mkdir_at(fd, name)
                    except FileExistsError:
                        pass
                nxt = self._open_dir_at(fd, name)
                os.close(fd)
                fd = nxt
            yield fd
        finally:
            os.close(fd)

    def _open_dir_at(self, fd: int, name: str) -> int:
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            raise NoSuchPath(f"no {name!r} here") from None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise PathRefused(f"{name!r} is not a folder (a file or a symbolic link)") from None
            raise

    def _mkdir_at(self, fd: int, name: str) -> None:
        os.mkdir(name, 0o700, dir_fd=fd)
        sub = self._open_dir_at(fd, name)
        try:
            if self.owner is not None:
                os.fchown(sub, self.owner.uid, self.owner.gid)
            os.fchmod(sub, self.dir_mode)
        finally:
            os.close(sub)

    # -- reading -----------------------------------------------------------------------------------------------

    def stat(self, names: tuple[str, ...]) -> Entry:
        if not names:
            with self.folder(()) as fd:
                return _entry("", os.fstat(fd))
        with self.folder(names[:-1]) as fd:
            return _entry(names[-1], self._lstat_at(fd, names[-1]))

    def _lstat_at(self, fd: int, name: str) -> os.stat_result:
        try:
            return os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            raise NoSuchPath(f"no {name!r} here") from None

    def list(self, names: tuple[str, ...], after: str = "", limit: int = 1000) -> tuple[list[Entry], str | None]:
        """One page of the folder's entries in name order, those after ``after``; and the name to continue after,
        or None on the last page. One pass over the names and a stat of only this page's entries, so a folder of
        100,000 files answers its first page quickly."""
        with self.folder(names) as fd:
            with os.scandir(fd) as it:
                wanted = (e.name for e in it if e.name > after)
                page = heapq.nsmallest(limit + 1, wanted)
            more = len(page) > limit
            page = page[:limit]
            out = []
            for name in page:
                try:
                    out.append(_entry(name, os.stat(name, dir_fd=fd, follow_symlinks=False)))
                except FileNotFoundError:  # gone since the scan
                    continue
        return out, (page[-1] if more else None)

    def _open_regular(self, names: tuple[str, ...]) -> tuple[int, int]:
        """A read descriptor of the regular file ``names`` and its size; a link, a FIFO or a device is refused
        without being opened."""
        with self.folder(names[:-1]) as parent:
            fd, st = _open_regular_at(parent, names[-1])
        if self.owner is not None and st.st_uid != self.owner.uid:
            os.close(fd)
            raise PathRefused(f"{names[-1]!r} belongs to another user")
        return fd, st.st_size

    def open_file(self, names: tuple[str, ...]) -> BinaryIO:
        """The regular file ``names`` as a binary file object to read (and seek)."""
        fd, _ = self._open_regular(names)
        return os.fdopen(fd, "rb")

    def reader(self, names: tuple[str, ...], chunk: int = 1 << 20) -> tuple[int, Iterator[bytes]]:
        """The file's size and its bytes: opened (and refused) now, read as the iterator is consumed."""
        fd, size = self._open_regular(names)

        def blocks() -> Iterator[bytes]:
            try:
                while block := os.read(fd, chunk):
                    yield block
            finally:
                os.close(fd)

        return size, blocks()

    # -- changing ----------------------------------------------------------------------------------------------

    def mkdir(self, names: tuple[str, ...], parents: bool = False) -> None:
        with self.folder(names[:-1], create=parents) as fd:
            try:
                self._mkdir_at(fd, names[-1])
            except FileExistsError:
                raise NameClash(f"{names[-1]!r} already exists") from None

    def move(self, src: tuple[str, ...], dst: tuple[str, ...]) -> None:
        if dst[: len(src)] == src:
            raise PathRefused("cannot move a folder into itself")
        with self.folder(src[:-1]) as a, self.folder(dst[:-1]) as b:
            self._lstat_at(a, src[-1])
            _rename_noreplace(a, src[-1], b, dst[-1])

    def delete(self, names: tuple[str, ...]) -> tuple[int, int]:
        """Remove a file, a link (not what it points to) or a folder with all it holds; the bytes and entries
        freed."""
        with self.folder(names[:-1]) as fd:
            st = self._lstat_at(fd, names[-1])
            if not stat.S_ISDIR(st.st_mode):
                os.unlink(names[-1], dir_fd=fd)
                return (st.st_size if stat.S_ISREG(st.st_mode) else 0), 1
            inner = os.open(names[-1], _DIR_FLAGS, dir_fd=fd)
            try:
                size, count = _usage(inner)
            finally:
                os.close(inner)
            shutil.rmtree(names[-1], dir_fd=fd)  # descriptor-based: never follows a link out
            return size, count + 1

    def usage(self) -> tuple[int, int]:
        """Bytes of regular files and number of entries below the root, by one walk that follows no link (the
        reconciliation of the counters; the unfinished uploads, kept outside, are not counted)."""
        with self.folder(()) as fd:
            return _usage(fd)

    def copy_folder(
        self, names: tuple[str, ...], dest: str, max_bytes: int, progress: Callable[[Copied], None] | None = None
    ) -> Copied:
        """Copy the folder ``names`` into the new folder ``dest`` (the platform's, root's), descriptor by
        descriptor, at most ``max_bytes``: regular files and folders only. Each entry's type is read first
        (lstat), so a link is left out, never followed nor copied as a link (what it points to would be read in
        the job that mounts the copy, not here), and a FIFO, socket or device is left out without being opened;
        in a personal space, what its owner does not own is left out too. ``progress`` hears of each file copied
        (it may stop the copy by raising). What was copied, and what was left out with why."""
        os.mkdir(dest, 0o755)
        out = os.open(dest, _DIR_FLAGS)
        copied = Copied()
        try:
            with self.folder(names) as src:
                self._copy_into(src, out, "", copied, max_bytes, _MAX_COPY_DEPTH, progress or (lambda _: None))
        finally:
            os.close(out)
        return copied

    def _copy_into(
        self,
        src: int,
        dst: int,
        at: str,
        copied: Copied,
        max_bytes: int,
        depth: int,
        progress: Callable[[Copied], None],
    ) -> None:
        if depth == 0:
            raise PathRefused(f"folders nested more than {_MAX_COPY_DEPTH} deep are not copied")
        with os.scandir(src) as it:
            names = sorted(e.name for e in it)
        for name in names:
            path = f"{at}{name}"
            try:
                st = os.stat(name, dir_fd=src, follow_symlinks=False)
            except FileNotFoundError:  # gone since the scan
                continue
            if self.owner is not None and st.st_uid != self.owner.uid:
                copied.leave_out(path, "another user's")
            elif stat.S_ISDIR(st.st_mode):
                try:
                    fd = os.open(name, _DIR_FLAGS, dir_fd=src)  # a folder swapped for anything else: ENOTDIR, ELOOP
                except OSError:
                    copied.leave_out(path, "changed while it was copied")
                    continue
                try:
                    os.mkdir(name, 0o755, dir_fd=dst)
                    sub = os.open(name, _DIR_FLAGS, dir_fd=dst)
                    try:
                        self._copy_into(fd, sub, f"{path}/", copied, max_bytes, depth - 1, progress)
                    finally:
                        os.close(sub)
                finally:
                    os.close(fd)
                copied.files += 1
            elif stat.S_ISREG(st.st_mode):
                if copied.size + st.st_size > max_bytes:
                    raise QuotaExceeded(f"the folder holds more than the {max_bytes} bytes allowed")
                try:
                    fd, st = _open_regular_at(src, name)
                except (PathRefused, NoSuchPath):
                    copied.leave_out(path, "changed while it was copied")
                    continue
                try:
                    copied.size += _copy_file(fd, name, dst, min(st.st_size, max_bytes - copied.size))
                finally:
                    os.close(fd)
                copied.files += 1
                progress(copied)
            else:
                copied.leave_out(path, "a symbolic link" if stat.S_ISLNK(st.st_mode) else "a FIFO, socket or device")

    # -- uploads: a part file in the platform's own folder, renamed into place when complete -------------------

    @contextmanager
    def _uploads(self) -> Iterator[int]:
        """The platform's folder of unfinished uploads: outside the space's root, on its file system (a rename
        moves a part into place), root's and 0700 below folders of root's, so no job reaches it, renames it or
        plants a link in its place: no member of a shared space sees or redirects another member's upload."""
        os.makedirs(self.uploads, mode=0o700, exist_ok=True)
        fd = os.open(self.uploads, _DIR_FLAGS)
        try:
            st = os.fstat(fd)
            if st.st_uid != os.geteuid() or st.st_mode & 0o077:
                raise PathRefused("the platform's upload folder is not its own")
            yield fd
        finally:
            os.close(fd)

    def new_part(self, upload_id: str) -> None:
        with self._uploads() as up:
            os.close(os.open(upload_id, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=up))

    def part_size(self, upload_id: str) -> int:
        with self._uploads() as up:
            try:
                return os.stat(upload_id, dir_fd=up, follow_symlinks=False).st_size
            except FileNotFoundError:
                raise NoSuchPath("the upload's data is gone; start it again") from None

    @contextmanager
    def part_writer(self, upload_id: str, offset: int) -> Iterator[DirectWriter]:
        """A writer that appends to the part from ``offset``, which must be its size (the client resumes where the
        platform stopped, never leaves a hole or writes twice); what it was given is in the part once it closes,
        an error inside the block included."""
        with self._uploads() as up:
            try:
                fd = os.open(upload_id, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=up)
            except FileNotFoundError:
                raise NoSuchPath("the upload's data is gone; start it again") from None
        try:
            size = os.fstat(fd).st_size
            if size != offset:
                raise OffsetMismatch(size)
            os.lseek(fd, offset, os.SEEK_SET)
            with DirectWriter(fd) as writer:
                yield writer
        finally:
            os.close(fd)

    def finish_part(self, upload_id: str, dst: tuple[str, ...], replace: bool = False) -> None:
        """Give the complete part its mode and owner and rename it to ``dst``; a name there already is a clash,
        unless ``replace`` (WebDAV's PUT): then the file, or a link, there is replaced, never written through."""
        with self._uploads() as up, self.folder(dst[:-1]) as target:
            fd = os.open(upload_id, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=up)
            try:
                os.fchmod(fd, self.file_mode)
                if self.owner is not None:
                    os.fchown(fd, self.owner.uid, self.owner.gid)
            finally:
                os.close(fd)
            if replace:
                if stat.S_ISDIR(self._lstat_or_none(target, dst[-1])):
                    raise NameClash(f"{dst[-1]!r} is a folder")
                os.rename(upload_id, dst[-1], src_dir_fd=up, dst_dir_fd=target)
            else:
                _rename_noreplace(up, upload_id, target, dst[-1])

    def _lstat_or_none(self, fd: int, name: str) -> int:
        try:
            return os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode
        except FileNotFoundError:
            return 0

    def part_names(self) -> list[str]:
        with self._uploads() as up:
            return os.listdir(up)

    def drop_part(self, upload_id: str) -> None:
        with self._uploads() as up:
            try:
                os.unlink(upload_id, dir_fd=up)
            except FileNotFoundError:
                pass


class OffsetMismatch(Exception):
    def __init__(self, size: int):
        super().__init__(f"the upload is at byte {size}")
        self.size = size


def _open_regular_at(dir_fd: int, name: str) -> tuple[int, os.stat_result]:
    """A read descriptor of the regular file ``name`` in ``dir_fd``, and its stat. The type is read on an
    ``O_PATH`` descriptor, which opens nothing (a device's driver, a FIFO's writer never see it), and only a
    regular file is then opened, through ``/proc/self/fd``: the same inode, whatever the name became meanwhile."""
    try:
        path_fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        raise NoSuchPath(f"no {name!r} here") from None
    try:
        st = os.fstat(path_fd)
        if stat.S_ISLNK(st.st_mode):
            raise PathRefused(f"{name!r} is a symbolic link; it is not followed")
        if not stat.S_ISREG(st.st_mode):
            raise PathRefused(f"{name!r} is not a regular file")
        return os.open(f"/proc/self/fd/{path_fd}", os.O_RDONLY | os.O_CLOEXEC), st
    finally:
        os.close(path_fd)


def _copy_file(src: int, name: str, dst_dir: int, size: int) -> int:
    out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dst_dir)
    try:
        done = 0
        while done < size:
            n = os.sendfile(out, src, done, min(size - done, 1 << 30))
            if n == 0:  # shorter than it was (written to meanwhile): what was there
                break
            done += n
        return done
    finally:
        os.close(out)


def _usage(fd: int) -> tuple[int, int]:
    size = count = 0
    for _, dirs, files, dir_fd in os.fwalk(".", dir_fd=fd, follow_symlinks=False):
        count += len(dirs) + len(files)
        for name in files:
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode):
                size += st.st_size
    return size, count


def make_root(path: str, owner: Owner | None, mode: int) -> None:
    """The space's root directory (its parents are the platform's), a real folder with ``mode`` and owner."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            raise RuntimeError(f"{path} is not a directory") from None
        return
    if owner is not None:
        os.lchown(path, owner.uid, owner.gid)
