"""The build form's VS Code option: yes or no, and a yes adds one fixed step to the Containerfile, which fetches
fixed tarballs of the npm registry and checks each against its published SHA-512 (no real build here: the step
is the one scripts/install-code-server runs on a host, see docs/ide.md)."""

from __future__ import annotations

import base64
import json
import re
import subprocess
from pathlib import Path

import pytest
from pydantic import ValidationError

from caldera.images.containerfile import render
from caldera.images.form import NPM_REGISTRY, VSCODE, BuildForm

LOCK = Path(__file__).parent.parent / "scripts" / "install-code-server"
BASE, REF = "localhost/caldera/base:bookworm", "localhost/ana/ide:1"


def _step(text: str) -> str:
    [step] = [s for s in re.split(r"\n(?=[A-Z]+ )", text) if "code-server" in s and s.startswith("RUN ")]
    return step


def test_vs_code_is_a_yes_or_no_that_adds_one_fixed_step() -> None:
    plain = render(BuildForm(name="ide", apt=["htop"], pip=["six"]), BASE, REF)
    assert "code-server" not in plain and "npm" not in plain
    text = render(BuildForm(name="ide", vscode=True, apt=["htop"], pip=["six"]), BASE, REF)
    step = _step(text)
    assert text.index(step) < text.index("htop") < text.index("six")  # a change of the user's builds on it
    fetched = re.findall(r"curl [^&]*?-o (\S+) (\S+) && echo '([0-9a-f]{128})  (\S+)' \| sha512sum --check", step)
    assert len(fetched) == len(VSCODE) == 3
    for (out, url, digest, checked), (path, integrity) in zip(fetched, VSCODE.values(), strict=True):
        assert out == checked and url == f"{NPM_REGISTRY}/{path}" and url.startswith("https://registry.npmjs.org/")
        assert bytes.fromhex(digest) == base64.b64decode(integrity.removeprefix("sha512-"))
    assert step.count("curl -") == 3 and "npm install --prefix /opt/code-server" in step and "./code-server.tgz" in step
    assert "/usr/local/bin/code-server" in step  # on the image's PATH, where the container runtime looks for it
    run = subprocess.run(["bash", "-n", "-c", step.removeprefix("RUN ")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr  # the step is one shell command line


def test_the_image_gets_the_code_server_the_hosts_get() -> None:
    lock = json.loads((LOCK.parent / "code-server" / "package-lock.json").read_text())
    pinned = lock["packages"]["node_modules/code-server"]
    assert VSCODE["code-server"] == (f"code-server/-/code-server-{pinned['version']}.tgz", pinned["integrity"])
    assert f"VERSION={pinned['version']}" in LOCK.read_text()


@pytest.mark.parametrize("value", ["yes", "true; curl evil", 1, None, ["x"]])
def test_vs_code_takes_nothing_but_a_boolean(value) -> None:
    with pytest.raises(ValidationError) as caught:
        BuildForm(name="ide", vscode=value)
    assert caught.value.errors()[0]["loc"] == ("vscode",)
