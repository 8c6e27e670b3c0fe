"""podman (and the conmon it starts) runs from a directory of the platform's own: a job that plants a symlink or a
directory of its own at that path in a shared /tmp does not choose where conmon writes."""

from __future__ import annotations

import os

from caldera.runtime.container.podman import private_dir


def test_an_existing_private_directory_is_used(tmp_path):
    d = tmp_path / "caldera-podman-0"
    assert private_dir(d) == d and d.stat().st_mode & 0o777 == 0o700
    assert private_dir(d) == d


def test_a_planted_symlink_or_open_directory_is_not_used(tmp_path):
    elsewhere = tmp_path / "attacker"
    elsewhere.mkdir()
    link = tmp_path / "caldera-podman-link"
    link.symlink_to(elsewhere)
    got = private_dir(link)
    assert got != link and not got.is_symlink() and got.stat().st_mode & 0o777 == 0o700
    assert not any(elsewhere.iterdir())

    shared = tmp_path / "caldera-podman-shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    got = private_dir(shared)
    assert got != shared and got.stat().st_mode & 0o777 == 0o700
