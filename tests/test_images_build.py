"""Real builds: buildah from a form, pushed to a real docker-registry, recorded; a failing build keeps its log and
leaves nothing; a quota overrun found after the build leaves nothing. Uses the tiny `six`; buildah's layer cache
makes every build after the first take seconds."""

from __future__ import annotations

import secrets
import subprocess
import time

import pytest

from caldera.images import registry
from caldera.runtime.container.runtime import ContainerRuntime
from caldera.runtime.container.settings import ContainerSettings
from tests import needs
from tests.conftest import make_settings, wait_for
from tests.images_fixtures import registry_port  # noqa: F401 - fixture
from tests.needs import buildah_usable  # noqa: F401 - fixture

pytestmark = pytest.mark.usefixtures("buildah_usable")


@pytest.fixture
def db_url():
    return None  # one database is enough for builds: the catalogue's SQL is tested by test_images on both


@pytest.fixture
def settings(tmp_path, registry_port):  # noqa: F811
    if subprocess.run(["podman", "image", "exists", ContainerSettings().image]).returncode != 0:
        needs.missing("needs the base image: caldera images bootstrap")
    return make_settings(tmp_path, None, **registry_port, image_build_memory_mib=1024)


@pytest.fixture
def ana(api, admin):
    return api.user(admin, "ana")


def _built(api, headers, form: dict) -> dict:
    r = api.client.post("/api/v1/images", json=form, headers=headers)
    assert r.status_code == 202, r.text
    img = r.json()
    assert img["state"] == "building"
    return wait_for(
        lambda: (
            (i := api.client.get(f"/api/v1/images/{img['id']}", headers=headers).json())["state"] != "building" and i
        ),
        timeout=600,
        interval=1,
        what="the build to end",
    )


def _local(ref: str) -> bool:
    return subprocess.run(["podman", "image", "exists", ref]).returncode == 0


@pytest.mark.timeout(600)  # two builds: the second on the first, from the catalogue
def test_a_form_builds_pushes_and_records_an_image_that_has_its_packages(api, ana, settings):
    t0 = time.monotonic()
    # a new token each run, so buildah's layer cache cannot replay an earlier build's output; cgroup v2 or v1 files
    limit = (
        f"RUN echo build={secrets.token_hex(4)}"
        " memory-limit=$(cat /sys/fs/cgroup/memory.max 2>/dev/null"
        " || cat /sys/fs/cgroup/memory$(awk -F: '$2==\"memory\"{print $3}' /proc/self/cgroup)/memory.limit_in_bytes)"
        " cpu-limit=$(if [ -e /sys/fs/cgroup/cpu.max ]; then tr ' ' / < /sys/fs/cgroup/cpu.max;"
        " else d=/sys/fs/cgroup/cpu$(awk -F: '$2~/(^|,)cpu(,|$)/{print $3}' /proc/self/cgroup);"
        " echo $(cat $d/cpu.cfs_quota_us)/$(cat $d/cpu.cfs_period_us); fi)"
    )
    form = {"name": "six-env", "tag": "1", "pip": ["six==1.16.0"], "apt": ["less"], "extra_lines": [limit]}
    img = _built(api, ana, form)
    assert img["state"] == "ready", img["message"]
    ref = img["reference"]
    assert ref == f"{registry.host(settings)}/user/ana/six-env:1"
    assert registry.tags(settings, "user/ana/six-env") == ["1"]
    assert img["size_bytes"] > 50 << 20 and img["form"]["pip"] == ["six==1.16.0"]
    log = api.client.get(f"/api/v1/images/{img['id']}/log", headers=ana).text
    assert "Successfully installed six-1.16.0" in log or "six==1.16.0" in log, log[-2000:]
    assert f"ready: {ref}" in log
    assert f"memory-limit={1024 << 20}" in log  # the build ran under its cgroup limits
    assert f"cpu-limit={int(100_000 * settings.image_build_cpus)}/100000" in log
    # built as the build user, in its storage: root's storage never held it, so this host pulls it with the
    # platform's login; without the login the registry refuses
    assert not _local(ref) and _in_build_storage(api, ref)
    anonymous = subprocess.run(["podman", "pull", "--tls-verify=false", ref], capture_output=True, text=True)
    refusal = anonymous.stderr.lower()
    assert anonymous.returncode != 0 and ("unauthorized" in refusal or "authentication required" in refusal), refusal
    assert ContainerRuntime(settings)._pull(ref) is not None and _local(ref)
    out = subprocess.run(
        ["podman", "run", "--rm", "--network=none", ref, "sh", "-c", "python3 -c 'import six; print(six.__version__)'"
         " && command -v less"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.stdout.split() == ["1.16.0", "/usr/bin/less"], out
    assert [i["id"] for i in api.client.get("/api/v1/images", headers=ana).json()] == [img["id"]]
    # the same reference again is a conflict, not a second record
    r = api.client.post("/api/v1/images", json={"name": "six-env", "tag": "1"}, headers=ana)
    assert r.status_code == 409, r.text
    # built on from the catalogue: the build user pulls it from the registry (its own copy removed first)
    assert _as_builder(api, "podman", "rmi", ref).returncode == 0
    on = _built(api, ana, {"name": "on-six", "base": img["id"], "extra_lines": ["RUN python3 -c 'import six'"]})
    assert on["state"] == "ready" and on["form"]["base"] == ref, on["message"]
    assert "buildah pull" in api.client.get(f"/api/v1/images/{on['id']}/log", headers=ana).text
    assert api.client.delete(f"/api/v1/images/{on['id']}", headers=ana).status_code == 204
    # deleting removes it from the registry and the catalogue at once, and from this host's storages once the
    # build queue's worker gets to it (podman's rmi waits on its storage lock while a build runs)
    assert api.client.delete(f"/api/v1/images/{img['id']}", headers=ana).status_code == 204
    assert registry.tags(settings, "user/ana/six-env") == []
    assert api.client.get("/api/v1/images", headers=ana).json() == []
    wait_for(lambda: not _local(ref) and not _in_build_storage(api, ref), timeout=120, what="the local copies to go")
    print(f"build+push+checks {time.monotonic() - t0:.1f} s")


def _as_builder(api, tool: str, *argv: str) -> subprocess.CompletedProcess:
    sandbox = api.client.app.state.builds.builder.sandbox
    return subprocess.run(
        [*sandbox.argv(tool), *argv], capture_output=True, text=True, env=sandbox.env(), cwd=sandbox.home, timeout=120
    )


def _in_build_storage(api, ref: str) -> bool:
    return _as_builder(api, "podman", "image", "exists", ref).returncode == 0


def _working_containers(api) -> set[str]:
    return set(_as_builder(api, "buildah", "containers", "-q").stdout.split())


def test_a_package_that_does_not_exist_fails_the_build_keeps_its_log_and_leaves_nothing(api, ana, settings):
    before = _working_containers(api)
    img = _built(api, ana, {"name": "broken", "pip": ["caldera-no-such-package-xyz"]})
    log = api.client.get(f"/api/v1/images/{img['id']}/log", headers=ana).text
    assert img["state"] == "failed", img
    assert img["message"] == "pip found no package caldera-no-such-package-xyz", (img, log[-4000:])
    assert img["size_bytes"] == 0 and not _local(img["reference"]) and not _in_build_storage(api, img["reference"])
    assert registry.tags(settings, "user/ana/broken") == []
    assert "No matching distribution found for caldera-no-such-package-xyz" in log
    # a failed build does not block a corrected one of the same name
    r = api.client.post("/api/v1/images", json={"name": "broken", "apt": ["no-such-deb-xyz"]}, headers=ana)
    assert r.status_code == 202, r.text
    img = wait_for(
        lambda: (
            (i := api.client.get(f"/api/v1/images/{r.json()['id']}", headers=ana).json())["state"] != "building" and i
        ),
        timeout=300,
        what="the apt build to fail",
    )
    assert img["state"] == "failed" and img["message"] == "apt found no package no-such-deb-xyz", img
    assert _working_containers(api) <= before  # buildah kept no half-built container


def test_a_build_over_the_quota_is_not_pushed_nor_recorded(api, admin, ana, settings):
    assert api.client.put("/api/v1/images/quotas/ana", json={"quota_mib": 1}, headers=admin).status_code == 200
    img = _built(api, ana, {"name": "big", "pip": ["six==1.16.0"]})
    assert img["state"] == "failed" and "image quota exceeded" in img["message"], img
    assert registry.tags(settings, "user/ana/big") == [] and not _in_build_storage(api, img["reference"])
