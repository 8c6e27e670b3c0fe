"""Images API without building: form validation, registry down, quotas, namespaces, and the visibility check
at job submission (against catalogue rows and a real docker-registry)."""

from __future__ import annotations

import threading
import time

import pytest
from fastapi.testclient import TestClient

from caldera.db.models import Image
from caldera.images import catalogue, registry
from caldera.images.form import BuildForm
from caldera.runtime.local import procs
from tests.conftest import free_port, make_settings, wait_for
from tests.images_fixtures import registry_port  # noqa: F401 - fixture

GOOD = {"name": "tools", "pip": ["six"]}


@pytest.fixture
def settings(tmp_path, db_url, registry_port):  # noqa: F811
    return make_settings(tmp_path, db_url, **registry_port)


@pytest.fixture
def people(api, admin):
    api.client.post("/api/v1/accounts", json={"name": "lab"}, headers=admin)
    ana = api.user(admin, "ana", default_account="lab")
    bob = api.user(admin, "bob", default_account="lab")
    for who in ("ana", "bob"):
        r = api.client.post("/api/v1/accounts/lab/members", json={"username": who}, headers=admin)
        assert r.status_code == 201, r.text
    return ana, bob


BAD = [
    ("pip", ["six; rm -rf /"]),
    ("pip", ["six $(id)"]),
    ("pip", ["git+https://example.org/x.git"]),
    ("apt", ["curl && curl evil"]),
    ("apt", ["Curl"]),
    ("vscode", "yes"),  # a yes or no, nothing else
    ("extra_lines", ["FROM busybox"]),
    ("extra_lines", ["RUN echo a\nFROM busybox"]),
    ("extra_lines", ["RUN echo a \\"]),
    ("extra_lines", ["RUN " + "x" * 600]),
    ("pip", ["six"] * 101),
    ("name", "Tools"),
    ("name", "../etc"),
    ("tag", "a/b"),
    ("cuda", "10.2"),
    ("cudnn", "7.6"),
    ("python", "2.7"),
    ("visibility", "everyone"),
    ("shell", "bash"),
]


# the CVE-2024-9675 line of issue 21 (a cache mount's id escapes to any host directory) and every other way to reach
# a builder flag, a second instruction or a heredoc through one expert line: each refused, and with its reason
REFUSED_LINES = [
    ("RUN --mount=type=cache,id=../../../../..,target=/x cat /x/var/lib/caldera/secrets.json", "takes no flags"),
    ("run --mount=type=bind,source=/,target=/host ls /host", "takes no flags"),
    ("RUN\t--network=host curl 127.0.0.1", "takes no flags"),
    ("RUN   --security=insecure id", "takes no flags"),
    ("RUN --device=/dev/sda id", "takes no flags"),
    ("RUN -v /:/host id", "takes no flags"),
    ("ENV --from=x A=1", "takes no flags"),
    ("RUN cat <<EOF", "heredoc"),
    ("RUN <<-'X' sh", "heredoc"),
    ("RUN echo a \\", "no continuation"),
    ("RUN echo a\u2028FROM busybox", "control characters"),
    ("RUN echo a\rFROM busybox", "control characters"),
    ("FROM busybox", "RUN/ENV/WORKDIR/LABEL"),
    ("COPY --from=0 / /x", "RUN/ENV/WORKDIR/LABEL"),
    ("ADD http://x/y /y", "RUN/ENV/WORKDIR/LABEL"),
    ("ONBUILD RUN id", "RUN/ENV/WORKDIR/LABEL"),
    ("# escape=`", "RUN/ENV/WORKDIR/LABEL"),
    (" RUN id", "RUN/ENV/WORKDIR/LABEL"),
    ('RUN ["sh", 1]', "JSON list of strings"),
    ("ENV 1A=2", "not a valid name"),
    ('ENV A="unclosed', "unclosed quote"),
    ("LABEL org.caldera.image=127.0.0.1:1/public/x:1", "the platform's"),
    ("WORKDIR ../../etc", "absolute path"),
]
ALLOWED_LINES = [
    "RUN echo $((1<<3)) && pip list",
    'RUN ["python3", "-c", "print(1)"]',
    'ENV A=1 B="two words"',
    "ENV LEGACY a value with spaces",
    "WORKDIR /opt/work",
    "LABEL maintainer=ana",
]


def test_an_expert_line_is_parsed_as_an_instruction_and_any_flag_is_refused_with_the_reason(api, people):
    for line, reason in REFUSED_LINES:
        r = api.client.post("/api/v1/images", json={**GOOD, "extra_lines": ["RUN true", line]}, headers=people[0])
        assert r.status_code == 400, (line, r.text)
        error = r.json()["errors"][0]
        assert error["field"].startswith("extra_lines") and reason in error["reason"], (line, error)
    with api.client.app.state.platform.session() as db:
        assert db.query(Image).count() == 0
    BuildForm(name="ok", extra_lines=ALLOWED_LINES)  # the forms an instruction may take still pass


def test_a_bad_form_field_is_a_400_naming_it(api, people):
    for field, value in BAD:
        r = api.client.post("/api/v1/images", json={**GOOD, field: value}, headers=people[0])
        assert r.status_code == 400, (field, value, r.text)
        assert r.json()["errors"][0]["field"].startswith(field), r.json()
    with api.client.app.state.platform.session() as db:
        assert db.query(Image).count() == 0


def test_the_form_offers_the_pythons_whose_base_exists_and_refuses_the_others(api, people):
    builder = api.client.app.state.builds.builder
    offered = api.client.get("/api/v1/images/options", headers=people[0]).json()
    assert offered["python"] == [v for v in ("3.9", "3.11", "3.13") if builder.has(builder.base_for(v))]
    assert builder.base_for("3.13").endswith(":trixie") and builder.base_for("3.11").endswith(":bookworm")
    missing = next((v for v in ("3.13", "3.11") if v not in offered["python"]), None)
    if missing is None:
        pytest.skip("both bases are on this host")
    r = api.client.post("/api/v1/images", json={**GOOD, "python": missing}, headers=people[0])
    assert r.status_code == 400 and r.json()["errors"][0]["field"] == "python", r.text
    assert "caldera images bootstrap --suite" in r.json()["errors"][0]["reason"]
    with api.client.app.state.platform.session() as db:
        assert db.query(Image).count() == 0


def test_a_registry_that_is_down_is_a_503_and_records_nothing(tmp_path, db_url):
    from caldera.server.app import create_app
    from caldera.server.platform import Platform
    from caldera.server.tenancy import bootstrap

    p = Platform.create(make_settings(tmp_path, db_url, registry_port=free_port()))
    with p.session() as db:
        bootstrap(db, "admin-password")
        db.commit()
    with TestClient(create_app(p, run_loop=False)) as c:
        tok = c.post("/api/v1/auth/login", json={"username": "admin", "password": "admin-password"}).json()
        r = c.post("/api/v1/images", json=GOOD, headers={"Authorization": f"Bearer {tok['access_token']}"})
    assert r.status_code == 503 and "not reachable" in r.json()["detail"], r.text
    with p.session() as db:
        assert db.query(Image).count() == 0
    p.engine.dispose()


def test_only_an_admin_sets_a_quota_and_a_user_over_it_cannot_build(api, admin, people):
    ana, _ = people
    assert api.client.put("/api/v1/images/quotas/ana", json={"quota_mib": 99999}, headers=ana).status_code == 403
    assert api.client.get("/api/v1/images/quotas/bob", headers=ana).status_code == 403
    r = api.client.put("/api/v1/images/quotas/ana", json={"quota_mib": 0}, headers=admin)
    assert r.status_code == 200, r.text
    assert api.client.get("/api/v1/images/quotas/ana", headers=ana).json()["quota_mib"] == 0
    entries = api.client.get("/api/v1/audit", headers=admin).json()["entries"]
    assert {"action": "set-image-quota", "target": "ana"}.items() <= entries[0].items()
    r = api.client.post("/api/v1/images", json=GOOD, headers=ana)
    assert r.status_code == 403 and "quota exceeded" in r.json()["detail"], r.text


def test_an_account_image_needs_membership(api, admin, people):
    ana, _ = people
    api.client.post("/api/v1/accounts", json={"name": "other"}, headers=admin)
    r = api.client.post("/api/v1/images", json={**GOOD, "visibility": "account", "account": "other"}, headers=ana)
    assert r.status_code == 403 and "not a member" in r.json()["detail"], r.text


def _ready(api, owner: str, ns: str, visibility: str, name: str) -> str:
    p = api.client.app.state.platform
    with p.session() as db:
        from caldera.server import tenancy

        user = tenancy.get_user(db, owner)
        img = catalogue.new(db, user, ns, name, "1", visibility, "form", {})
        img.state, img.size_bytes, img.finished_at = "ready", 1000, time.time()
        db.commit()
        return catalogue.reference(p.settings, img)


def test_a_job_naming_another_users_private_image_is_refused(api, people):
    ana, bob = people
    private = _ready(api, "ana", "user/ana", "private", "mine")
    public = _ready(api, "ana", "public", "public", "shared")
    account = _ready(api, "ana", "account/lab", "account", "lab-env")
    job = {"name": "j", "command": ["true"]}
    r = api.client.post("/api/v1/jobs", json={**job, "image": private}, headers=bob)
    assert r.status_code == 403 and "not yours" in r.json()["detail"], r.text
    for ref in (public, account):
        assert api.client.post("/api/v1/jobs", json={**job, "image": ref}, headers=bob).status_code == 201
    assert api.client.post("/api/v1/jobs", json={**job, "image": private}, headers=ana).status_code == 201
    missing = private.replace("mine", "nothing")
    r = api.client.post("/api/v1/jobs", json={**job, "image": missing}, headers=ana)
    assert r.status_code == 404 and "no image" in r.json()["detail"], r.text
    # what bob may use is listed; ana's private image is not
    refs = {i["reference"] for i in api.client.get("/api/v1/images", headers=bob).json()}
    assert refs == {public, account}
    assert api.client.get("/api/v1/images", headers=ana).status_code == 200


def _building(p, owner: str, name: str, source: str) -> str:
    from caldera.images.builds import log_path
    from caldera.server import tenancy

    with p.session() as db:
        img = catalogue.new(db, tenancy.get_user(db, owner), f"user/{owner}", name, "1", "private", source, GOOD)
        db.commit()
    log = log_path(p, img.id)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("STEP 1/4: FROM base\n")
    return img.id


class _StoppedBuilder:
    """A builder whose every build is cut short by a stopping server, as the real one's is (BuildStopped)."""

    def __init__(self):
        self.built: list[str] = []
        self.done = threading.Event()

    def prepare(self):
        pass

    def build(self, form, ref, log):
        from caldera.images.builds import BuildStopped

        self.built.append(ref)
        self.done.set()
        raise BuildStopped("stopped")

    def stop(self):
        pass


def test_a_restarted_server_builds_again_the_forms_it_was_building_and_marks_interrupted_snapshots_lost(api, people):
    from caldera.images.builds import BuildQueue

    p = api.client.app.state.platform
    form, snap = _building(p, "ana", "half", "form"), _building(p, "ana", "snap", "snapshot")
    builder = _StoppedBuilder()
    BuildQueue(p, builder)  # what a restarted server makes
    assert builder.done.wait(10) and builder.built == [f"{registry.host(p.settings)}/user/ana/half:1"]
    again = api.client.get(f"/api/v1/images/{form}", headers=people[0]).json()
    assert again["state"] == "building", again
    log = api.client.get(f"/api/v1/images/{form}/log", headers=people[0]).text
    assert log.startswith("STEP 1/4: FROM base\n") and "the server restarted: this build starts again" in log
    lost = api.client.get(f"/api/v1/images/{snap}", headers=people[0]).json()
    assert lost["state"] == "failed" and lost["message"].startswith("Lost"), lost
    assert api.client.get(f"/api/v1/images/{snap}/log", headers=people[0]).text == "STEP 1/4: FROM base\n"
    assert api.client.get(f"/api/v1/images/{form}", headers=people[1]).status_code == 404  # private to ana


def test_a_stopping_server_ends_the_running_build_with_all_it_started_and_drops_the_queue(api, people, tmp_path):
    from caldera.images.builds import log_path

    p, q = api.client.app.state.platform, api.client.app.state.builds
    iid = _building(p, "ana", "long", "form")
    started, ran = threading.Event(), []
    pid_file = tmp_path / "sleep.pid"

    def work(image_id):
        started.set()
        q.builder.run(["sh", "-c", f"sleep 300 & echo $! > {pid_file}; wait"], log_path(p, image_id), 600)

    q.submit(iid, work)
    q.submit("queued-after", ran.append)
    assert started.wait(10)
    wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(), 10)
    child = int(pid_file.read_text())
    child_start = procs.start_time(child)
    assert child_start is not None  # running before the stop
    t0 = time.monotonic()
    q.stop()
    assert time.monotonic() - t0 < 10 and ran == []
    assert not procs.is_alive(child, child_start)  # the tool's child too, not only the tool
    img = api.client.get(f"/api/v1/images/{iid}", headers=people[0]).json()
    assert img["state"] == "building", img  # neither ready nor failed: the next start builds it again
    log = api.client.get(f"/api/v1/images/{iid}/log", headers=people[0]).text
    assert log.rstrip().endswith("stopped: the server stopped during it")


class _RecordingBuilder:
    """A builder whose removals are recorded (the first one fails, as podman's ``rmi`` may)."""

    def __init__(self):
        self.removed: list[str] = []

    def prepare(self):
        pass

    def stop(self):
        pass

    def remove(self, ref):
        self.removed.append(ref)
        if len(self.removed) == 1:
            raise RuntimeError("storage is locked")


def test_a_deleted_images_local_copies_go_after_the_work_queued_before_and_a_failure_stops_nothing(api):
    from caldera.images.builds import BuildQueue

    builder, release, ran = _RecordingBuilder(), threading.Event(), []
    q = BuildQueue(api.client.app.state.platform, builder)
    q.submit("img-a", lambda image_id: (release.wait(10), ran.append(image_id)))
    q.discard("reg/user/ana/a:1")
    q.discard("reg/user/ana/b:1")
    assert builder.removed == []  # the caller is not held while a build runs
    release.set()
    done = threading.Event()
    q.submit("img-c", lambda image_id: (ran.append(image_id), done.set()))
    assert done.wait(10)
    q.stop()
    assert builder.removed == ["reg/user/ana/a:1", "reg/user/ana/b:1"] and ran == ["img-a", "img-c"]
