"""The path layer of storage spaces as an attacker meets it: every refused path shape, and a space in which a job
planted links to /etc and to another space, a FIFO, a hard link to a file it does not own, and a folder swapped for
a link. The platform never reads, writes, lists or deletes through any of them."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from caldera.storage.backends.local import UPLOADS_DIR, LocalBackend
from caldera.storage.errors import NameClash, NoSuchPath, PathRefused
from caldera.storage.paths import file_parts, parts
from caldera.storage.spaces import Kind, SpaceRef
from caldera.storage.tree import OffsetMismatch, Owner, Tree, make_root
from tests.conftest import make_settings

ROOT = os.geteuid() == 0


@pytest.mark.parametrize(
    "path",
    ["..", "../x", "a/../../x", "a/..", "/etc/passwd", "/", "a\0b", "a\nb", "tab\there", "x\x7f",
     "a/" + "n" * 256, "é" * 128 + "/x", "x" * 5000],
)  # fmt: skip
def test_refused_paths(path):
    with pytest.raises(PathRefused):
        parts(path)


@pytest.mark.parametrize(
    ("path", "names"),
    [("a/b", ("a", "b")), ("./a//b/", ("a", "b")), ("with space/ünïcødé 文件", ("with space", "ünïcødé 文件")),
     ("", ()), ("...", ("...",)), ("..a", ("..a",))],
)  # fmt: skip
def test_accepted_paths(path, names):
    assert parts(path) == names


def test_the_root_is_no_file():
    with pytest.raises(PathRefused):
        file_parts("./")


@pytest.fixture
def space(tmp_path) -> Tree:
    root = tmp_path / "space"
    make_root(str(root), None, 0o755)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "secret.txt").write_text("another space's file")
    (root / "data").mkdir()
    (root / "data" / "a.txt").write_text("hello")
    # what a job planted
    os.symlink("/etc/passwd", root / "passwd")
    os.symlink("/etc", root / "etc")
    os.symlink(str(tmp_path / "other"), root / "other")
    os.symlink("../other/secret.txt", root / "data" / "rel")
    os.mkfifo(root / "fifo")
    return Tree(str(root), str(tmp_path / "uploads"))


@pytest.mark.parametrize("path", ["passwd", "etc/passwd", "other/secret.txt", "data/rel", "etc/shadow"])
def test_no_read_through_a_link(space, path):
    with pytest.raises(PathRefused):
        list(space.reader(parts(path)))


@pytest.mark.parametrize("path", ["etc", "other", "data/rel"])
def test_no_listing_through_a_link(space, path):
    with pytest.raises(PathRefused):
        space.list(parts(path))


def test_links_are_listed_as_links_never_followed(space):
    entries, more = space.list(())
    kinds = {e.name: (e.kind, e.size) for e in entries}
    assert more is None
    assert kinds["passwd"] == ("link", 0) and kinds["etc"] == ("link", 0) and kinds["data"][0] == "dir"
    assert kinds["fifo"] == ("other", 0)
    assert space.stat(parts("other")).kind == "link"


def test_a_fifo_is_refused_without_hanging(space):
    with pytest.raises(PathRefused, match="not a regular file"):
        list(space.reader(parts("fifo")))


def test_no_write_or_mkdir_through_a_link(space, tmp_path):
    with pytest.raises(PathRefused):
        space.mkdir(parts("other/planted"))
    with pytest.raises(PathRefused):
        space.mkdir(parts("etc/x/y"), parents=True)
    space.new_part("u1")
    with pytest.raises(PathRefused):
        space.finish_part("u1", parts("other/planted.txt"))
    with pytest.raises(PathRefused):
        space.move(parts("data/a.txt"), parts("other/a.txt"))
    assert sorted(os.listdir(tmp_path / "other")) == ["secret.txt"]


def test_delete_removes_the_link_not_its_target(space, tmp_path):
    assert space.delete(parts("other")) == (0, 1)
    assert space.delete(parts("passwd")) == (0, 1)
    assert (tmp_path / "other" / "secret.txt").read_text() == "another space's file"
    assert Path("/etc/passwd").exists()
    with pytest.raises(PathRefused):  # a folder's content is not reached through a link either
        space.delete(parts("etc/passwd"))


def test_deleting_a_folder_never_follows_links_inside(space, tmp_path):
    os.symlink(str(tmp_path / "other"), Path(space.root) / "data" / "into-other")
    size, count = space.delete(parts("data"))
    assert (size, count) == (5, 4)  # a.txt, rel, into-other and the folder itself
    assert (tmp_path / "other" / "secret.txt").exists()


def test_usage_counts_files_not_what_links_point_to(space):
    size, count = space.usage()
    assert size == 5  # data/a.txt only: /etc and the other space are not walked
    assert count == 7  # data, a.txt, rel, passwd, etc, other, fifo


def test_a_folder_swapped_for_a_link_is_refused(space, tmp_path):
    """A job replaces a folder by a link between two requests: the next request meets the link and stops."""
    root = Path(space.root)
    os.rename(root / "data", root / "data-old")
    os.symlink(str(tmp_path / "other"), root / "data")
    with pytest.raises(PathRefused):
        list(space.reader(parts("data/secret.txt")))


@pytest.mark.skipif(not ROOT, reason="ownership needs root")
def test_a_personal_space_serves_only_its_owners_files(tmp_path):
    """A hard link (or any file) not owned by the space's owner is not served: a job cannot make the root server
    read a file of root's or another user's by linking it into its space."""
    root = tmp_path / "home"
    owner = Owner(54321, 54321)
    make_root(str(root), owner, 0o700)
    foreign = tmp_path / "foreign.txt"
    foreign.write_text("root's")
    os.link(foreign, root / "linked.txt")
    tree = Tree(str(root), str(tmp_path / "uploads"), owner)
    with pytest.raises(PathRefused, match="another user"):
        list(tree.reader(parts("linked.txt")))
    tree.mkdir(parts("made"))
    st = os.lstat(root / "made")
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (54321, 0o755)


def test_upload_parts_resume_and_never_replace(space):
    space.new_part("u2")
    with space.part_writer("u2", 0) as part:
        part.write(b"abc")
    with pytest.raises(OffsetMismatch) as exc, space.part_writer("u2", 0):
        pass
    assert exc.value.size == 3
    with space.part_writer("u2", 3) as part:
        part.write(b"def")
    assert space.part_size("u2") == 6
    assert [e.name for e in space.list(())[0]] == ["data", "etc", "fifo", "other", "passwd"]  # unfinished: invisible
    with pytest.raises(NameClash):
        space.finish_part("u2", parts("data/a.txt"))
    assert b"".join(space.reader(parts("data/a.txt"))[1]) == b"hello"
    space.finish_part("u2", parts("data/b.txt"))
    assert b"".join(space.reader(parts("data/b.txt"))[1]) == b"abcdef"
    with pytest.raises(NoSuchPath):
        space.part_size("u2")


def test_no_job_reaches_where_other_users_uploads_go(tmp_path):
    """An account's space is 0777 inside, so any rw member's job can rename, replace or link over what lies in
    it. The parts of other members' uploads are not in it: a job that renames the folder they would be in (to
    read them through the API), or plants a link by that name to a folder of its own, gets nothing, and the upload
    still arrives. An upload folder earlier versions left inside a space is removed."""
    backend = LocalBackend(make_settings(tmp_path))
    ref = SpaceRef(Kind.ACCOUNT, "vision")
    data = backend.host_path(ref)
    tree = backend.store(ref, None)
    tree.new_part("victim")
    with tree.part_writer("victim", 0) as part:
        part.write(b"another member's upload")
    assert os.listdir(data) == []
    for name in os.listdir(backend.uploads_path(ref).parent):  # what a job could rename to read it through the API
        assert name == "data" or not (backend.uploads_path(ref).parent / name).is_relative_to(data)
    (tmp_path / "mine").mkdir()
    os.symlink(tmp_path / "mine", data / UPLOADS_DIR)
    os.symlink(tmp_path / "mine", data / "uploads")
    tree.finish_part("victim", parts("arrived.bin"))
    assert (data / "arrived.bin").read_bytes() == b"another member's upload" and os.listdir(tmp_path / "mine") == []
    st = os.stat(backend.uploads_path(ref))
    assert st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o700

    os.unlink(data / UPLOADS_DIR)
    (data / UPLOADS_DIR).mkdir(mode=0o700)  # as an earlier version left it
    (data / UPLOADS_DIR / ("a" * 32)).write_bytes(b"unfinished")
    (data / "sub" / UPLOADS_DIR).mkdir(parents=True, mode=0o700)  # a user's folder of that name: theirs
    (data / "sub" / UPLOADS_DIR / "notes.txt").write_text("mine")
    backend.store(ref, None)
    assert not (data / UPLOADS_DIR).exists() and (data / "sub" / UPLOADS_DIR / "notes.txt").exists()
    (data / UPLOADS_DIR).mkdir(mode=0o700)
    (data / UPLOADS_DIR / "notes.txt").write_text("mine")
    backend.store(ref, None)
    assert (data / UPLOADS_DIR / "notes.txt").exists()


def test_paging_a_large_folder(tmp_path):
    root = tmp_path / "big"
    make_root(str(root), None, 0o755)
    for i in range(2500):
        (root / f"f{i:05d}").touch()
    tree = Tree(str(root), str(tmp_path / "uploads"))
    seen, after = [], ""
    while True:
        page, nxt = tree.list((), after=after, limit=1000)
        seen += [e.name for e in page]
        if nxt is None:
            break
        after = nxt
    assert seen == [f"f{i:05d}" for i in range(2500)]


def test_copying_a_folder_opens_no_fifo_or_device_a_job_planted(space, tmp_path):
    """A job waits, as a FIFO's writer, for the platform to open it while publishing the folder (an open unblocks
    it), and plants a device node: the copy reads each entry's type first and opens neither; links are left out,
    not copied, and each left-out entry is named with why."""
    root = Path(space.root)
    os.mkfifo(root / "data" / "pipe")
    if ROOT:
        os.mknod(root / "data" / "tty", 0o600 | stat.S_IFCHR, os.makedev(5, 0))
    writer = threading.Thread(target=lambda: os.close(os.open(root / "data" / "pipe", os.O_WRONLY)), daemon=True)
    writer.start()
    try:
        copied = space.copy_folder(parts("data"), str(tmp_path / "copy"), 1 << 20)
        writer.join(0.5)
        assert writer.is_alive(), "the platform opened the FIFO"
    finally:
        os.close(os.open(root / "data" / "pipe", os.O_RDONLY | os.O_NONBLOCK))  # lets the writer go
        writer.join(5)
    assert sorted(os.listdir(tmp_path / "copy")) == ["a.txt"]
    assert (copied.size, copied.files) == (5, 1)
    assert "pipe: a FIFO, socket or device" in copied.left_out and "rel: a symbolic link" in copied.left_out
    assert not ROOT or "tty: a FIFO, socket or device" in copied.left_out
