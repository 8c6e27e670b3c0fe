"""The images page in a real browser (Debian's chromium through Playwright) against a real `caldera up` with its
own docker-registry: a build form with a bad package name shows the API's error; a real build (a fresh RUN line,
so buildah's layer cache cannot replay it, with a pause in the middle) shows its log while it runs, ends ready,
and the image is in the list with a link that starts a session from it. Screenshot in test-output/portal/."""

from __future__ import annotations

import secrets
import subprocess

import httpx
import pytest

from caldera.runtime.container.settings import ContainerSettings
from tests import needs
from tests.conftest import ServerProcess, free_port, kill_job_processes, server_env, traversable
from tests.needs import buildah_usable  # noqa: F401 - fixture
from tests.test_browser import browser  # noqa: F401 - the chromium fixture
from tests.test_portal_browser import _shot, signed_in_page
from tests.test_server_process import token

pytestmark = [
    pytest.mark.parametrize("db_url", ["sqlite"], indirect=True),
    pytest.mark.usefixtures("buildah_usable"),
]


@pytest.fixture
def images_server(tmp_path, db_url):
    needs.program("docker-registry", "docker-registry")
    if subprocess.run(["podman", "image", "exists", ContainerSettings().image]).returncode != 0:
        needs.missing("needs the base image: caldera images bootstrap")
    env = server_env(tmp_path, db_url)  # with a registry port of its own
    srv = ServerProcess(traversable(tmp_path) / "data", free_port(), env).start()  # starts its registry too
    yield srv
    srv.stop()
    kill_job_processes(srv.data_dir)


def test_build_an_image_and_follow_its_log_in_the_browser(images_server, browser):  # noqa: F811
    server = images_server
    admin = token(server)
    r = httpx.post(server.url + "/api/v1/users", json={"username": "alice", "password": "password-123"}, headers=admin)
    assert r.status_code == 201, r.text
    page, violations = signed_in_page(browser, server, "alice", "password-123")
    page.goto(server.url + "/images")

    page.fill("#build-image input[name=name]", "live-env")
    page.fill("#build-image input[name=pip]", "six;rm")
    page.click("#build-image button[type=submit]")
    error = page.wait_for_selector("ul.err")
    assert "'six;rm' is not a pip requirement" in error.inner_text()
    assert page.input_value("#build-image input[name=name]") == "live-env"  # what was typed stays

    tok = secrets.token_hex(4)  # the shell's arithmetic makes the output differ from the step's text in the log
    marker, after = f"started-42-{tok}", f"finished-42-{tok}"
    page.fill("#build-image input[name=pip]", "")
    line = f"RUN echo started-$((40+2))-{tok} && sleep 5 && echo finished-$((40+2))-{tok}"
    page.fill("#build-image textarea[name=extra_lines]", line)
    page.click("#build-image button[type=submit]")
    page.wait_for_url("**/images")
    log = page.locator("details.build[open] pre.log")
    page.wait_for_selector(f"details.build[open] pre.log:has-text('{marker}')", timeout=120_000)
    image_id = page.get_attribute("details.build[open]", "id").removeprefix("build-")
    state = httpx.get(f"{server.url}/api/v1/images/{image_id}", headers=token(server, "alice", "password-123"))
    assert state.json()["state"] == "building" and after not in log.inner_text()  # live, not replayed
    page.wait_for_selector("details.build pre.log[data-done=true]", timeout=300_000)
    assert after in log.inner_text() and "ready: " in log.inner_text()
    assert page.inner_text(f"#build-state-{image_id}").startswith("ready")
    assert page.inner_text(f"#state-{image_id}").startswith("ready")  # the list's row, without a reload
    _shot(page, "images")

    page.reload()  # the image in the list, ready, with its session link; no build left to follow
    row = page.locator(f"tr[data-image='{image_id}']")
    assert "/user/alice/live-env:latest" in row.inner_text() and "ready" in row.inner_text()
    row.locator("a.start-job").click()
    page.wait_for_url(lambda url: "/new/batch?image=" in url)
    assert page.input_value("select[name=image]").endswith("/user/alice/live-env:latest")
    assert not violations, violations
    h = token(server, "alice", "password-123")
    assert httpx.delete(f"{server.url}/api/v1/images/{image_id}", headers=h, timeout=30).status_code == 204
