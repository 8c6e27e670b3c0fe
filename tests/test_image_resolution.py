"""Finding 7 of issue 21: a job's ``image:`` is resolved through the catalogue only. Another user's private image
ran when a job named it by its podman image id, its digest or a short name, because only the registry reference
was checked and podman resolved the rest on the host. Now every form of name maps to a catalogue entry the user
may run (or is refused), and the job (so the runtime) holds the catalogue's reference, never the user's string.
The images here are real: pushed to a real docker-registry, so their digests are the registry's."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
import time

import httpx
import pytest

from caldera.images import catalogue, registry
from caldera.server import tenancy
from tests.conftest import free_port, make_settings
from tests.images_fixtures import registry_port  # noqa: F401 - fixture
from tests.test_images import people  # noqa: F401 - fixture: ana and bob, members of account lab

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
JOB = {"name": "j", "command": ["true"]}


@pytest.fixture
def settings(tmp_path, db_url, registry_port):  # noqa: F811
    return make_settings(tmp_path, db_url, **registry_port)


def _blob(settings, repository: str, data: bytes) -> dict:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    base, login = registry.url(settings), registry.auth(settings)
    start = httpx.post(f"{base}/v2/{repository}/blobs/uploads/", auth=login, timeout=10)
    assert start.status_code == 202, start.text
    location = start.headers["Location"]
    location = location if location.startswith("http") else base + location
    sep = "&" if "?" in location else "?"
    put = httpx.put(f"{location}{sep}digest={digest}", content=data, auth=login, timeout=10,
                    headers={"Content-Type": "application/octet-stream"})  # fmt: skip
    assert put.status_code == 201, put.text
    return {"digest": digest, "size": len(data)}


def _push(settings, repository: str, tag: str) -> tuple[str, str]:
    """A one-file image pushed as the platform pushes its builds: (its manifest digest, its config digest = the
    image id podman shows)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        content = f"{repository}:{tag}\n".encode()
        info = tarfile.TarInfo("which")
        info.size = len(content)
        tar.addfile(info, io.BytesIO(content))
    layer = _blob(settings, repository, gzip.compress(raw.getvalue(), mtime=0))
    diff_id = "sha256:" + hashlib.sha256(raw.getvalue()).hexdigest()
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {},
                         "rootfs": {"type": "layers", "diff_ids": [diff_id]}}).encode()  # fmt: skip
    cfg = _blob(settings, repository, config)
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **cfg},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **layer}],
    }
    r = httpx.put(f"{registry.url(settings)}/v2/{repository}/manifests/{tag}", json=manifest,
                  auth=registry.auth(settings), timeout=10,
                  headers={"Content-Type": "application/vnd.oci.image.manifest.v1+json"})  # fmt: skip
    assert r.status_code == 201, r.text
    return r.headers["Docker-Content-Digest"], cfg["digest"]


def _image(api, owner: str, ns: str, visibility: str, name: str, tag: str = "1") -> dict:
    """A ready catalogue entry for an image really in the registry."""
    p = api.client.app.state.platform
    manifest, config = _push(p.settings, f"{ns}/{name}", tag)
    with p.session() as db:
        img = catalogue.new(db, tenancy.get_user(db, owner), ns, name, tag, visibility, "form", {})
        img.state, img.size_bytes, img.finished_at = "ready", 1000, time.time()
        db.commit()
        return {"id": img.id, "ref": catalogue.reference(p.settings, img), "manifest": manifest, "config": config}


def _submit(api, who, image: str):
    return api.client.post("/api/v1/jobs", json={**JOB, "image": image}, headers=who)


def _names(img: dict, host: str) -> list[str]:
    """Every way a user may name the image: reference, without the registry, short name, catalogue id, podman id
    (whole, with sha256:, and its 12-character prefix), manifest digest, reference by digest."""
    path = img["ref"].removeprefix(host + "/").rsplit(":", 1)[0]
    config_hex, manifest_hex = img["config"].removeprefix("sha256:"), img["manifest"].removeprefix("sha256:")
    return [img["ref"], img["ref"].removeprefix(host + "/"), path.rsplit("/", 1)[1] + ":1", img["id"],
            config_hex, img["config"], config_hex[:12], img["manifest"], manifest_hex,
            f"{host}/{path}@{img['manifest']}", f"{path}@{img['manifest']}"]  # fmt: skip


def test_another_users_private_image_is_refused_by_every_name(api, people):  # noqa: F811
    ana, bob = people
    host = registry.host(api.client.app.state.platform.settings)
    private = _image(api, "ana", "user/ana", "private", "mine")
    for name in _names(private, host):
        r = _submit(api, bob, name)
        assert r.status_code in (403, 404), (name, r.status_code, r.text)
        reason = r.json()["detail"]
        assert "not yours to use" in reason or "no image" in reason, (name, reason)
    # the owner runs it by every one of those names, and the job holds the catalogue's reference, not the name
    for name in _names(private, host):
        r = _submit(api, ana, name)
        assert r.status_code == 201, (name, r.text)
        assert r.json()["spec"]["image"] == private["ref"], name


def test_names_outside_the_catalogue_are_refused_and_the_platform_images_run(api, people):  # noqa: F811
    ana, _ = people
    for name in ("busybox", "docker.io/library/python:3.11", "quay.io/x/y:1", "localhost/ana/mine:1",
                 "sha256:" + "0" * 64, "0123456789ab", "user/ana/../bob/x:1"):  # fmt: skip
        r = _submit(api, ana, name)
        assert r.status_code == 404 and "no image" in r.json()["detail"], (name, r.text)
    for name, resolved in (
        ("caldera/base:bookworm", "localhost/caldera/base:bookworm"),  # the default image
        ("localhost/caldera/base:trixie", "localhost/caldera/base:trixie"),
        ("caldera/test-jupyter:bookworm", "localhost/caldera/test-jupyter:bookworm"),
    ):
        r = _submit(api, ana, name)
        assert r.status_code == 201 and r.json()["spec"]["image"] == resolved, (name, r.text)
    assert api.client.post("/api/v1/jobs", json=JOB, headers=ana).json()["spec"]["image"] is None  # the runtime's


def test_a_short_name_prefers_the_users_own_and_refuses_to_guess_between_others(api, people):  # noqa: F811
    ana, bob = people
    public = _image(api, "ana", "public", "public", "env")
    account = _image(api, "ana", "account/lab", "account", "env")
    r = _submit(api, bob, "env:1")
    assert r.status_code == 400 and "several images" in r.json()["detail"], r.text
    assert _submit(api, bob, public["ref"]).json()["spec"]["image"] == public["ref"]
    assert _submit(api, bob, account["id"]).json()["spec"]["image"] == account["ref"]
    own = _image(api, "bob", "user/bob", "private", "env")
    assert _submit(api, bob, "env:1").json()["spec"]["image"] == own["ref"]
    assert _submit(api, ana, "env").status_code == 404  # no tag is "latest", which is not there


def test_a_registry_that_is_down_when_a_digest_must_be_looked_up_is_a_503(tmp_path, db_url):
    from fastapi.testclient import TestClient

    from caldera.server.app import create_app
    from caldera.server.platform import Platform
    from caldera.server.tenancy import bootstrap

    p = Platform.create(make_settings(tmp_path, db_url, registry_port=free_port()))
    with p.session() as db:
        bootstrap(db, "admin-password")
        img = catalogue.new(db, tenancy.get_user(db, "admin"), "public", "x", "1", "public", "form", {})
        img.state = "ready"
        db.commit()
    with TestClient(create_app(p, run_loop=False)) as c:
        tok = c.post("/api/v1/auth/login", json={"username": "admin", "password": "admin-password"}).json()
        r = c.post("/api/v1/jobs", json={**JOB, "image": "sha256:" + "a" * 64},
                   headers={"Authorization": f"Bearer {tok['access_token']}"})  # fmt: skip
    assert r.status_code == 503 and "image registry" in r.json()["detail"], r.text
    p.engine.dispose()


def test_under_podman_a_host_images_id_is_refused_and_the_resolved_default_runs(tmp_path, db_url):
    """The attack as it was, against a real `caldera up` on the container runtime: a job named an image by the id
    podman shows (here the base image's, which is in no catalogue), and podman ran it. Now it is refused, and the
    platform image named by its short name runs under the reference it resolves to."""
    from caldera.runtime.container import probe
    from caldera.runtime.container.image import ImageInfo
    from caldera.runtime.container.podman import Podman
    from caldera.runtime.container.settings import ContainerSettings
    from tests.conftest import ServerProcess, kill_job_processes, server_env, traversable
    from tests.test_server_process import token, until

    if not probe.usable():
        pytest.skip("needs podman and the base image (caldera images bootstrap)")
    cs = ContainerSettings()
    base = ImageInfo.load(Podman(cs.global_args()), cs.image)
    assert base is not None
    env = {**server_env(tmp_path, db_url), "CALDERA_RUNTIME": "container"}
    srv = ServerProcess(traversable(tmp_path) / "data", free_port(), env).start()
    try:
        h = token(srv)
        job = {"name": "which", "command": ["cat", "/etc/debian_version"]}
        for name in (base.id, base.id[:12], "sha256:" + base.id):
            r = httpx.post(srv.url + "/api/v1/jobs", json={**job, "image": name}, headers=h)
            assert r.status_code == 404 and "no image" in r.json()["detail"], (name, r.text)
        r = httpx.post(srv.url + "/api/v1/jobs", json={**job, "image": cs.image}, headers=h)
        assert r.status_code == 201 and r.json()["spec"]["image"] == "localhost/" + cs.image, r.text
        done = until(srv, h, r.json()["id"], {"Succeeded", "Failed"}, timeout=120)
        assert done["state"] == "Succeeded", done
        log = httpx.get(f"{srv.url}/api/v1/jobs/{done['id']}/logs", headers=h).text
        assert log.strip()[:2].isdigit(), log
    finally:
        srv.stop()
        kill_job_processes(srv.data_dir)
