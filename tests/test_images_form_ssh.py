"""The build form's SSH option: yes or no, and a yes installs OpenSSH's server and nss_wrapper (what `caldera ssh`
runs as the job's uid, caldera/runtime/job_sshd.py) in the form's own apt step, without the host keys the package
makes: each image built here would otherwise carry the same ones. The platform's default image has it."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from caldera.images.containerfile import render
from caldera.images.form import SSH_PACKAGES, BuildForm
from caldera.images.ready import READY

BASE, REF = "localhost/caldera/base:bookworm", "localhost/ana/remote:1"


def _apt_steps(text: str) -> list[str]:
    return [s for s in text.splitlines() if s.startswith("RUN apt-get") and "python3-venv" not in s]


def test_ssh_adds_the_server_to_the_forms_apt_step_and_drops_its_host_keys() -> None:
    assert _apt_steps(render(BuildForm(name="remote", apt=["htop"]), BASE, REF)) == [
        "RUN apt-get -o Acquire::Retries=5 update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o Acquire::Retries=5 "
        "install -y -qq --no-install-recommends htop && rm -rf /var/lib/apt/lists/*"
    ]
    [step] = _apt_steps(render(BuildForm(name="remote", ssh=True, apt=["htop", "openssh-server"]), BASE, REF))
    installed = re.search(r"--no-install-recommends ([^&]+) &&", step)
    assert installed is not None and installed[1].split() == [*SSH_PACKAGES, "htop"]  # each package once
    assert step.endswith("&& rm -f /etc/ssh/ssh_host_*")
    assert not _apt_steps(render(BuildForm(name="remote"), BASE, REF))


def test_the_default_environment_has_the_ssh_server() -> None:
    assert READY["default"].form("bookworm").ssh


@pytest.mark.parametrize("value", ["yes", "true; rm -rf /", 1, None])
def test_ssh_takes_nothing_but_a_boolean(value) -> None:
    with pytest.raises(ValidationError) as caught:
        BuildForm(name="remote", ssh=value)
    assert caught.value.errors()[0]["loc"] == ("ssh",)
