"""`caldera images bootstrap` and the spec's image: importing a kept tarball (what CI does on every run after the
first) gives an image jobs run in; a job names its image or gets the default one."""

from __future__ import annotations

import json
import subprocess
import uuid

import pytest
from typer.testing import CliRunner

from caldera.cli.main import app
from caldera.core.spec import SpecError, parse_spec
from caldera.runtime.container import probe
from caldera.runtime.container.podman import Podman
from caldera.runtime.container.settings import DEFAULT_IMAGE, ContainerSettings
from tests.needs import podman_usable  # noqa: F401 - fixture


def test_a_spec_names_its_image_or_gets_the_default() -> None:
    assert parse_spec({"name": "a", "command": ["true"]}).image is None  # the runtime's default image
    assert ContainerSettings().image == DEFAULT_IMAGE == "caldera/default:bookworm"
    assert parse_spec({"name": "a", "command": ["true"], "image": "alice/torch:2.3"}).image == "alice/torch:2.3"
    for bad in ("--privileged", "a b", "x" * 300, "../etc"):
        with pytest.raises(SpecError) as err:
            parse_spec({"name": "a", "command": ["true"], "image": bad})
        assert err.value.errors[0]["field"] == "image"


@pytest.mark.usefixtures("podman_usable")
def test_bootstrap_imports_a_kept_tree_as_an_image(tmp_path) -> None:
    tree = tmp_path / "tree"
    (tree / "etc").mkdir(parents=True)
    (tree / "etc" / "os-release").write_text("ID=caldera-test\n")
    cache = tmp_path / "base.tar"
    subprocess.run(["tar", "-C", str(tree), "-cf", str(cache), "."], check=True)
    tag = f"caldera/test-bootstrap:{uuid.uuid4().hex[:8]}"
    pm = Podman(ContainerSettings().global_args())
    try:
        result = CliRunner().invoke(app, ["images", "bootstrap", "--tag", tag, "--cache", str(cache)])
        assert result.exit_code == 0, result.output
        assert f"using {cache}" in result.output  # no debootstrap: the tarball was kept
        cfg = json.loads(pm.run("image", "inspect", tag, "--format", "{{json .Config}}"))
        assert "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" in cfg["Env"]
    finally:
        pm.run("rmi", "--force", tag, check=False)


def test_bootstrap_says_why_it_cannot(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no debootstrap, no podman
    result = CliRunner().invoke(app, ["images", "bootstrap", "--cache", str(tmp_path / "none.tar")])
    assert result.exit_code == 1
    assert "cannot make the base image" in result.output and "debootstrap" in result.output


def test_container_is_a_registered_runtime_and_the_default_only_where_usable(monkeypatch) -> None:
    import importlib
    import tomllib
    from pathlib import Path

    from caldera.config import Settings
    from caldera.runtime import default

    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    target = pyproject["project"]["entry-points"]["caldera.runtimes"]["container"]
    module, cls = target.split(":")
    assert getattr(importlib.import_module(module), cls).name == "container"

    monkeypatch.delenv("CALDERA_RUNTIME", raising=False)
    monkeypatch.setattr(probe, "usable", lambda cs=None: False)
    assert Settings().runtime == "auto"  # chosen when the platform starts, not by the settings
    assert default.default_name() == "local" and default.resolved(Settings()).runtime == "local"
    monkeypatch.setattr(probe, "usable", lambda cs=None: True)
    assert default.default_name() == "container" and default.resolved(Settings()).runtime == "container"
    assert default.resolved(Settings(runtime="local")).runtime == "local"  # an admin's choice wins
