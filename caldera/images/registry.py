"""The OCI registry images are pushed to: Debian's ``docker-registry`` run by the platform on 127.0.0.1 with its
storage in the data directory, or any registry given by URL (``CALDERA_REGISTRY_URL``). Only the registry's own
HTTP API (v2) is used, so any distribution-compatible registry serves.

The platform's registry asks for a login (htpasswd, bcrypt) that only the platform holds: a job of the process
runtime shares the host's network and would otherwise push to any namespace. The login is generated once and kept
0600 in the platform's data directory; buildah and podman get it as a private authfile, never on a command line
(which any user reads in /proc)."""

from __future__ import annotations

import base64
import ctypes
import json
import os
import secrets
import shutil
import signal
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from caldera.config import Settings
from caldera.images.sandbox import ROOT_ENV

_MANIFESTS = ", ".join(
    (
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.v2+json",
        "application/vnd.oci.image.index.v1+json",
    )
)


class RegistryError(RuntimeError):
    pass


def url(settings: Settings) -> str:
    return (settings.registry_url or f"http://127.0.0.1:{settings.registry_port}").rstrip("/")


def host(settings: Settings) -> str:
    """What image references start with: ``127.0.0.1:8650`` in ``127.0.0.1:8650/user/ana/torch:1``."""
    return urlsplit(url(settings)).netloc


def insecure(settings: Settings) -> bool:
    return urlsplit(url(settings)).scheme == "http"


USERNAME = "caldera-platform"


def credentials_path(settings: Settings) -> Path:
    return settings.registry_credentials or settings.data_dir / "registry" / "credentials.json"


def _write_private(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def ensure_credentials(settings: Settings) -> tuple[str, str]:
    """The platform's registry login, generated on first use."""
    path = credentials_path(settings)
    if not path.exists():
        _write_private(path, json.dumps({"username": USERNAME, "password": secrets.token_urlsafe(32)}))
    data = json.loads(path.read_text())
    return data["username"], data["password"]


def auth(settings: Settings) -> tuple[str, str] | None:
    """The login for HTTP calls; None for a registry given by URL without one."""
    path = credentials_path(settings)
    return ensure_credentials(settings) if path.exists() or not settings.registry_url else None


def auth_json(settings: Settings) -> str | None:
    """The login as a containers-auth.json document; None for a registry given by URL without one."""
    login = auth(settings)
    if login is None:
        return None
    token = base64.b64encode(f"{login[0]}:{login[1]}".encode()).decode()
    return json.dumps({"auths": {host(settings): {"auth": token}}})


def authfile(settings: Settings) -> Path | None:
    """A containers-auth.json (0600, beside the credentials) for buildah and podman's ``--authfile``."""
    text = auth_json(settings)
    if text is None:
        return None
    path = credentials_path(settings).with_name("auth.json")
    _write_private(path, text)
    return path


def htpasswd(settings: Settings) -> Path:
    """The registry's htpasswd file (bcrypt), from the platform's login."""
    import bcrypt  # only the process that starts the registry needs it

    user, password = ensure_credentials(settings)
    path = credentials_path(settings).with_name("htpasswd")
    _write_private(path, f"{user}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt()).decode()}\n")
    return path


def ping(settings: Settings, timeout_s: float = 2.0) -> bool:
    try:
        return httpx.get(f"{url(settings)}/v2/", timeout=timeout_s).status_code in (200, 401)
    except httpx.HTTPError:
        return False


def require_up(settings: Settings) -> None:
    if not ping(settings):
        raise RegistryError(f"the image registry at {url(settings)} is not reachable")


def delete(settings: Settings, repository: str, tag: str) -> None:
    """Removes a tag's manifest (its blobs go at the registry's next garbage collection). Absent is fine."""
    base = f"{url(settings)}/v2/{repository}/manifests"
    try:
        head = httpx.head(f"{base}/{tag}", headers={"Accept": _MANIFESTS}, auth=auth(settings), timeout=10)
        digest = head.headers.get("Docker-Content-Digest")
        if head.status_code == 404 or not digest:
            return
        r = httpx.delete(f"{base}/{digest}", auth=auth(settings), timeout=10)
    except httpx.HTTPError as exc:
        raise RegistryError(f"the image registry at {url(settings)} is not reachable: {exc}") from None
    if r.status_code not in (202, 404):
        raise RegistryError(f"the registry refused to delete {repository}:{tag} ({r.status_code})")


def digests(settings: Settings, repository: str, tag: str) -> set[str]:
    """The digests that name this tag's image: its manifest's (``name@sha256:...``) and its config's (the image id
    podman shows). Empty when the tag is not there."""
    try:
        r = httpx.get(
            f"{url(settings)}/v2/{repository}/manifests/{tag}",
            headers={"Accept": _MANIFESTS},
            auth=auth(settings),
            timeout=10,
        )
    except httpx.HTTPError as exc:
        raise RegistryError(f"the image registry at {url(settings)} is not reachable: {exc}") from None
    if r.status_code != 200:
        return set()
    found = {r.headers.get("Docker-Content-Digest", ""), (r.json().get("config") or {}).get("digest", "")}
    return {d for d in found if d.startswith("sha256:")}


def tags(settings: Settings, repository: str) -> list[str]:
    r = httpx.get(f"{url(settings)}/v2/{repository}/tags/list", auth=auth(settings), timeout=10)
    return (r.json().get("tags") or []) if r.status_code == 200 else []


def config(storage: str, port: int, htpasswd_path: str) -> dict:
    """docker-registry's configuration: loopback only, the platform's login required, deletes allowed (an image
    removed from the catalogue goes)."""
    return {
        "version": 0.1,
        "log": {"level": "warn"},
        "auth": {"htpasswd": {"realm": "caldera", "path": htpasswd_path}},
        "storage": {"filesystem": {"rootdirectory": storage}, "delete": {"enabled": True}},
        "http": {"addr": f"127.0.0.1:{port}", "headers": {"X-Content-Type-Options": ["nosniff"]}},
    }


_PR_SET_PDEATHSIG = 1


def _dies_with(parent: int):
    """For the registry's child process: SIGTERM when the server that started it dies, however it dies. Killed with
    SIGKILL, a server left its registry serving the old configuration on the port, and the next start's own
    registry could not bind it."""

    def setup() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the server died before the line above took effect
            os._exit(1)

    return setup


def start_local(settings: Settings, binary: str = "docker-registry", wait_s: float = 15.0) -> subprocess.Popen | None:
    """Starts the platform's own registry when none is given by URL and the binary is installed; None otherwise."""
    if settings.registry_url or shutil.which(binary) is None:
        return None
    root = settings.data_dir / "registry"
    (root / "storage").mkdir(parents=True, exist_ok=True)
    conf = root / "config.yml"
    os.chmod(root, 0o700)
    config_text = json.dumps(config(str(root / "storage"), settings.registry_port, str(htpasswd(settings))))
    _write_private(conf, config_text)  # JSON is YAML
    log = open(root / "registry.log", "ab")  # noqa: SIM115 - the child holds it
    proc = subprocess.Popen(
        [binary, "serve", str(conf)],
        stdout=log,
        stderr=log,
        stdin=subprocess.DEVNULL,
        env=ROOT_ENV,  # docker-registry reads REGISTRY_* overrides of its configuration from its environment
        preexec_fn=_dies_with(os.getpid()),  # prctl only, before exec
    )
    log.close()
    deadline = time.monotonic() + wait_s
    while not ping(settings, 0.5):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RegistryError(f"docker-registry did not start; see {root / 'registry.log'}")
        time.sleep(0.1)
    return proc
