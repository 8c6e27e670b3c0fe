"""The OCI registry images are pushed to: Debian's ``docker-registry`` run by the platform on 127.0.0.1 with its
storage in the data directory, or any registry given by URL (``CALDERA_REGISTRY_URL``). Only the registry's own
HTTP API (v2) is used, so any distribution-compatible registry serves."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from urllib.parse import urlsplit

import httpx

from caldera.config import Settings

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
        head = httpx.head(f"{base}/{tag}", headers={"Accept": _MANIFESTS}, timeout=10)
        digest = head.headers.get("Docker-Content-Digest")
        if head.status_code == 404 or not digest:
            return
        r = httpx.delete(f"{base}/{digest}", timeout=10)
    except httpx.HTTPError as exc:
        raise RegistryError(f"the image registry at {url(settings)} is not reachable: {exc}") from None
    if r.status_code not in (202, 404):
        raise RegistryError(f"the registry refused to delete {repository}:{tag} ({r.status_code})")


def tags(settings: Settings, repository: str) -> list[str]:
    r = httpx.get(f"{url(settings)}/v2/{repository}/tags/list", timeout=10)
    return (r.json().get("tags") or []) if r.status_code == 200 else []


def config(storage: str, port: int) -> dict:
    """docker-registry's configuration: loopback only, deletes allowed (an image removed from the catalogue goes)."""
    return {
        "version": 0.1,
        "log": {"level": "warn"},
        "storage": {"filesystem": {"rootdirectory": storage}, "delete": {"enabled": True}},
        "http": {"addr": f"127.0.0.1:{port}", "headers": {"X-Content-Type-Options": ["nosniff"]}},
    }


def start_local(settings: Settings, binary: str = "docker-registry", wait_s: float = 15.0) -> subprocess.Popen | None:
    """Starts the platform's own registry when none is given by URL and the binary is installed; None otherwise."""
    if settings.registry_url or shutil.which(binary) is None:
        return None
    root = settings.data_dir / "registry"
    (root / "storage").mkdir(parents=True, exist_ok=True)
    conf = root / "config.yml"
    conf.write_text(json.dumps(config(str(root / "storage"), settings.registry_port)))  # JSON is YAML
    log = open(root / "registry.log", "ab")  # noqa: SIM115 - the child holds it
    proc = subprocess.Popen([binary, "serve", str(conf)], stdout=log, stderr=log, stdin=subprocess.DEVNULL)
    log.close()
    deadline = time.monotonic() + wait_s
    while not ping(settings, 0.5):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RegistryError(f"docker-registry did not start; see {root / 'registry.log'}")
        time.sleep(0.1)
    return proc
