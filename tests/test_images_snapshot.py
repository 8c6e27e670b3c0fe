"""Snapshots: a user installs a package (from a wheel in their workspace: sessions have no network) and a file
into a running Jupyter session's image, saves the session, starts a new session from the saved image and finds
both there. The save and the new session go through the portal's job page, images page and new-job form. Runs a
real podman container runtime, buildah and docker-registry."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from urllib.parse import quote

import pytest
from sqlalchemy import select

from caldera.db.models import User
from caldera.images import registry
from caldera.runtime.container.runtime import container_name
from tests.conftest import make_settings, wait_for
from tests.images_fixtures import registry_port  # noqa: F401 - fixture
from tests.needs import buildah_usable, podman_usable  # noqa: F401 - fixtures
from tests.portal import browser_for, post_form
from tests.test_images_build import _built, _local
from tests.test_runs import _submit, _until

pytestmark = pytest.mark.usefixtures("buildah_usable", "podman_usable")


@pytest.fixture
def db_url():
    return None


@pytest.fixture
def settings(tmp_path, registry_port):  # noqa: F811
    return make_settings(tmp_path, None, **registry_port, runtime="container")


def _exec(job: dict, uid: int, script: str) -> subprocess.CompletedProcess:
    ctr = container_name(job["id"], job["attempt"], 0)
    argv = ["podman", "exec", "--user", f"{uid}:{uid}", ctr, "sh", "-c", script]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def _inspect(ref: str) -> dict:
    out = subprocess.run(["podman", "image", "inspect", ref], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout)[0]


def _carries_nothing_of_the_session(snap: str, source: str, secrets: dict[str, str], job: dict) -> None:
    """The snapshot's configuration is its source image's: none of the session's environment (the user's values,
    nor the platform's), nor the lab's command line, working directory, user or labels (finding 9, issue 21)."""
    got, base = _inspect(snap), _inspect(source)
    text = json.dumps({k: v for k, v in got.items() if k not in ("RootFS", "Id", "Digest", "RepoDigests")})
    for value in (*secrets.values(), *(v.split("\n")[-1] for v in secrets.values()), job["id"], "lab.sock"):
        assert value not in text, value
    for name in (*secrets, "CALDERA_JOB_ID", "JUPYTER_TOKEN_FILE", "HOME", "USER", "CALDERA_PREEMPT_NOTICE"):
        assert not any(e.startswith(f"{name}=") for e in got["Config"].get("Env") or []), name
    # the same variables (their order is podman's, not meaningful: a pulled image may list them otherwise)
    assert sorted(got["Config"].get("Env") or []) == sorted(base["Config"].get("Env") or [])
    for key in ("Cmd", "Entrypoint", "WorkingDir", "User", "Labels"):
        assert got["Config"].get(key) == base["Config"].get(key), key


def _snapshot(api, headers, body: dict | None, iid: str = "") -> dict:
    """The snapshot of ``body`` (or the one already started, ``iid``) once it has ended."""
    if body is not None:
        r = api.client.post("/api/v1/images/snapshots", json=body, headers=headers)
        assert r.status_code == 202, r.text
        iid = r.json()["id"]
    return wait_for(
        lambda: (i := api.client.get(f"/api/v1/images/{iid}", headers=headers).json())["state"] != "building" and i,
        timeout=300,
        what="the snapshot",
    )


@pytest.mark.timeout(600)  # a first run builds the lab image too
def test_a_saved_session_keeps_what_the_user_installed(api, admin, settings, tmp_path):
    ana, bob = api.user(admin, "ana"), api.user(admin, "bob")
    lab = _built(api, ana, {"name": "lab", "tag": "1", "jupyter": True})
    assert lab["state"] == "ready", lab
    wheels = tmp_path / "wheels"
    pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels), "six==1.16.0"]
    subprocess.run(pip, check=True, timeout=300)
    wheel = next(wheels.glob("six-*.whl"))

    secrets = {"OPENAI_API_KEY": "sk-session-secret-1", "NOTE": "multi\nline-secret-2"}
    jid = _submit(api, ana, name="lab", kind="jupyter", image=lab["reference"], env=secrets)
    job = _until(api, ana, jid, {"Running", "Failed"}, timeout=120)
    assert job["state"] == "Running", job
    with api.client.app.state.platform.session() as db:
        uid = db.scalar(select(User.os_uid).where(User.username == "ana"))
    home = settings.workspaces / "ana"
    shutil.copy(wheel, home / wheel.name)
    done = _exec(job, uid, f"pip install -q --no-index {home / wheel.name} && echo kept > /opt/venv/ana-note")
    assert done.returncode == 0, done

    # nobody else saves ana's session; a job that is not a running session is no snapshot
    r = api.client.post("/api/v1/images/snapshots", json={"job_id": jid, "name": "stolen"}, headers=bob)
    assert r.status_code in (403, 404), r.text
    batch = _submit(api, ana, name="b", command=["true"])
    r = api.client.post("/api/v1/images/snapshots", json={"job_id": batch, "name": "lab"}, headers=ana)
    assert r.status_code == 409 and "running interactive session" in r.json()["detail"], r.text

    # saved from the job's page, the way a student does it; the images page then follows its log
    portal = browser_for(api.client, "ana", "password-123")
    assert 'id="save-image"' in portal.get(f"/jobs/{jid}").text
    r = post_form(portal, f"/jobs/{jid}/snapshot", {"name": "lab", "tag": "2"})
    assert r.status_code == 303 and r.headers["location"].startswith("/images#build-"), r.text
    iid = r.headers["location"].split("#build-")[1]
    assert f'data-stream="/api/v1/images/{iid}/stream"' in portal.get("/images").text
    snap = _snapshot(api, ana, None, iid)
    assert snap["state"] == "ready" and snap["source"] == "snapshot", snap
    assert snap["reference"] == f"{registry.host(settings)}/user/ana/lab:2"
    assert sorted(registry.tags(settings, "user/ana/lab")) == ["1", "2"]
    assert 0 < snap["size_bytes"] <= settings.snapshot_max_mib << 20
    _carries_nothing_of_the_session(snap["reference"], lab["reference"], secrets, job)
    # a snapshot over the cap is refused and leaves nothing
    api.client.app.state.platform.settings.snapshot_max_mib = 1
    big = _snapshot(api, ana, {"job_id": jid, "name": "lab", "tag": "3"})
    assert big["state"] == "failed" and "over the 1 MiB cap" in big["message"], big
    assert "3" not in registry.tags(settings, "user/ana/lab") and not _local(big["reference"])
    api.client.post(f"/api/v1/jobs/{jid}/cancel", headers=ana)

    # a new session from the images page's link, whose form has the snapshot chosen
    link = f"/new/jupyter?image={quote(snap['reference'])}"
    assert f'href="{link}"' in portal.get("/images").text
    assert f'<option value="{snap["reference"]}" selected>' in portal.get(link).text
    r = post_form(portal, "/new/jupyter", {"name": "lab-again", "queue": "default", "image": snap["reference"]})
    assert r.status_code == 303, r.text
    again = r.headers["location"].rsplit("/", 1)[1]
    job = _until(api, ana, again, {"Running", "Failed"}, timeout=120)
    assert job["state"] == "Running", job
    found = _exec(job, uid, "python3 -c 'import six; print(six.__version__)'; cat /opt/venv/ana-note")
    assert found.stdout.split() == ["1.16.0", "kept"], found
    # and bob may not run ana's private snapshot
    r = api.client.post("/api/v1/jobs", json={"name": "x", "kind": "jupyter", "image": snap["reference"]}, headers=bob)
    assert r.status_code == 403, r.text
    api.client.post(f"/api/v1/jobs/{again}/cancel", headers=ana)
    _until(api, ana, again, {"Cancelled", "Failed", "Succeeded"}, timeout=60)
