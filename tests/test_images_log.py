"""A build's log through the API, read the way a job's log is: followed while the build runs (each line as it is
written, the response ending when the build does, with the build's last line), from an offset, and kept after a
failure. Only its owner and admins read it: for another user it does not exist, even when the image is public."""

from __future__ import annotations

import threading
import time

import pytest

from caldera.db.models import User
from caldera.images import catalogue
from caldera.images.builds import BuildFailed, log_path
from tests.test_job_stream import parse_sse

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def _queued_build(api, work, visibility="public") -> str:
    """A catalogue row of ana's in the real build queue, whose build is ``work`` (the queue's own hook)."""
    p = api.client.app.state.platform
    with p.session() as db:
        ana = db.query(User).filter_by(username="ana").one()
        ns = catalogue.namespace(ana, visibility, None)
        img = catalogue.new(db, ana, ns, "env", "1", visibility, "form", {})
        db.commit()
        image_id = img.id
    api.client.app.state.builds.submit(image_id, work)
    return image_id


def _two_step_build(p, go_on: threading.Event):
    """A build that logs step 1, waits for ``go_on``, logs step 2 and fails."""

    def work(image_id: str) -> None:
        with log_path(p, image_id).open("a") as log:
            log.write("step 1\n")
            log.flush()
            assert go_on.wait(30)
            log.write("step 2\n")
        raise BuildFailed("step 3 broke")

    return work


def test_a_followed_build_log_streams_while_it_runs_and_ends_with_the_build(api, admin):
    ana = api.user(admin, "ana")
    bob = api.user(admin, "bob")
    p = api.client.app.state.platform
    go_on = threading.Event()
    image_id = _queued_build(api, _two_step_build(p, go_on))
    got: list[tuple[float, bytes]] = []
    url = f"/api/v1/images/{image_id}/log?follow=true"
    with api.client.stream("GET", url, headers=ana) as r:
        assert r.status_code == 200
        for chunk in r.iter_bytes():
            got.append((time.monotonic(), chunk))
            if b"step 1" in chunk and not go_on.is_set():
                time.sleep(0.5)  # the build is held: the response must not have ended, nor step 2 come
                go_on.set()
    text = b"".join(c for _, c in got).decode()
    assert text.startswith("step 1\n") and "step 2\n" in text, text
    assert text.rstrip().endswith("build failed: step 3 broke"), text  # the last line came before the end
    assert len(got) >= 2  # step 1 arrived on its own, before the build went on
    state = api.client.get(f"/api/v1/images/{image_id}", headers=ana).json()
    assert state["state"] == "failed" and state["message"] == "step 3 broke"

    # the kept log, whole and from an offset, for its owner and an admin; bob sees a public image, not its log
    assert api.client.get(f"/api/v1/images/{image_id}/log", headers=ana).text == text
    assert api.client.get(f"/api/v1/images/{image_id}/log?offset=7", headers=admin).text == text[7:]
    assert api.client.get(f"/api/v1/images/{image_id}", headers=bob).status_code == 200
    for follow in ("false", "true"):
        r = api.client.get(f"/api/v1/images/{image_id}/log?follow={follow}", headers=bob)
        assert r.status_code == 404 and "step" not in r.text, r.text
    assert api.client.get("/api/v1/images/nosuchimage/log", headers=ana).status_code == 404
    assert api.client.get(f"/api/v1/images/{image_id}/log?offset=-1", headers=ana).status_code == 400


def test_a_build_waiting_in_the_queue_is_followed_from_its_start(api, admin):
    """A follower of a build queued behind another waits for it, instead of ending at once with nothing."""
    ana = api.user(admin, "ana")
    p = api.client.app.state.platform
    release = threading.Event()

    def first(image_id: str) -> None:
        assert release.wait(30)
        raise BuildFailed("first")

    def second(image_id: str) -> None:
        log_path(p, image_id).write_text("second ran\n")
        raise BuildFailed("second")

    _queued_build(api, first, "private")
    with p.session() as db:
        ana_row = db.query(User).filter_by(username="ana").one()
        img = catalogue.new(db, ana_row, "user/ana", "env", "2", "private", "form", {})
        db.commit()
        waiting = img.id
    api.client.app.state.builds.submit(waiting, second)
    # the builds' directory is the platform's alone: jobs of other users pass through the data dir
    assert log_path(p, waiting).parent.stat().st_mode & 0o777 == 0o700
    threading.Timer(1.0, release.set).start()
    t0 = time.monotonic()
    text = api.client.get(f"/api/v1/images/{waiting}/log?follow=true", headers=ana).text
    assert time.monotonic() - t0 >= 0.9 and text.startswith("second ran\n") and "build failed: second" in text, text


def test_a_build_streams_as_server_sent_events_like_a_job(api, admin):
    """The images page's follower: the build's state, its log as it is written, then the end with the result."""
    ana = api.user(admin, "ana")
    bob = api.user(admin, "bob")
    p = api.client.app.state.platform
    go_on = threading.Event()
    image_id = _queued_build(api, _two_step_build(p, go_on))
    lines = []
    with api.client.stream("GET", f"/api/v1/images/{image_id}/stream", headers=ana) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            lines.append(line)
            if "step 1" in line:
                go_on.set()
    events = parse_sse(lines)
    assert events[0]["event"] == "state" and events[0]["data"]["state"] == "building"
    log = "".join(e["data"] for e in events if e["event"] == "log")
    assert log.startswith("step 1\nstep 2\n") and log.rstrip().endswith("build failed: step 3 broke"), log
    assert events[-1]["event"] == "end" and events[-1]["data"] == {"state": "failed", "message": "step 3 broke"}
    r = api.client.get(f"/api/v1/images/{image_id}/stream", headers=bob)
    assert r.status_code == 404 and "step" not in r.text


def test_a_failed_build_names_its_cause_from_the_log(tmp_path, db_url):
    """What the user reads when a build fails: the log's cause, else the builder's exit."""
    from caldera.images.builds import _cause

    log = tmp_path / "b.log"
    log.write_text("W: Failed to fetch http://deb.debian.org/debian/dists/bookworm/InRelease  Temporary failure\n")
    assert _cause(log, "exited 100") == (
        "apt could not fetch http://deb.debian.org/debian/dists/bookworm/InRelease from its mirror"
    )
    log.write_text("E: Unable to locate package nope\n")
    assert _cause(log, "exited 100") == "apt found no package nope"
    log.write_text("nothing we know\n")
    assert _cause(log, "exited 100") == "exited 100"
