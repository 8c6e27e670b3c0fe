"""A queued job's place in the queue (its ``QueuePosition`` reason) comes from the last scheduling cycle, kept in
memory (caldera/server/queue_positions.py), not from its row: through the real app, the live loop and the fake
runtime, the API's views and the portal show the same reasons, a row holds only what the cycle said of the job
itself, the places move up with the queue without a row rewritten, and after a restart they come back with the
first cycle (a place stored by the code before is shown until then, and dropped from the row by that cycle)."""

from __future__ import annotations

from markupsafe import escape
from sqlalchemy import event

from caldera.db.models import Job
from caldera.server.web.reason_text import Say
from tests.conftest import api_on, make_settings
from tests.fake_runtime import FakeRuntime
from tests.portal import browser_for
from tests.test_runs import _submit

EN = Say(str)
OLD_PLACE = {"code": "QueuePosition", "message": "position 9 in the queue", "details": {"position": 9}}


def _why(api, admin, jid) -> list[dict]:
    return api.client.get(f"/api/v1/jobs/{jid}/why", headers=admin).json()["pending"]


def _places(api, admin, ids) -> list[int | None]:
    return [
        next((r["details"]["position"] for r in _why(api, admin, j) if r["code"] == "QueuePosition"), None) for j in ids
    ]


def _stored(api, ids) -> dict[str, list]:
    with api.client.app.state.platform.session() as db:
        return {j: db.get(Job, j).pending_reasons for j in ids}


def _reasons_written(api) -> list[str]:
    """The statements that write a job's pending reasons, from now on."""
    written: list[str] = []

    def seen(conn, cursor, statement, *args) -> None:
        if statement.startswith("UPDATE jobs SET pending_reasons"):
            written.append(statement)

    event.listen(api.client.app.state.platform.engine, "before_cursor_execute", seen)
    return written


def test_places_come_from_the_last_cycle_and_are_not_stored(tmp_path) -> None:
    settings = make_settings(tmp_path, f"sqlite:///{tmp_path / 'caldera.db'}", run_jobs_as="server")  # 4 GPUs
    with api_on(settings, FakeRuntime(settings)) as (api, admin):
        c, loop = api.client, api.client.app.state.loop
        _submit(api, admin, name="busy", command=["sleep", "1000"], resources={"gpu": 4})
        waiting = [_submit(api, admin, name=f"w{i}", command=["true"], resources={"gpu": 1}) for i in range(4)]
        loop.tick()
        assert _places(api, admin, waiting) == [1, 2, 3, 4]
        listed = {j["id"]: j["pending_reasons"] for j in c.get("/api/v1/jobs", headers=admin).json()}
        page = browser_for(c, "admin", "admin-password")
        for jid in waiting:
            why = _why(api, admin, jid)
            assert c.get(f"/api/v1/jobs/{jid}", headers=admin).json()["pending_reasons"] == why == listed[jid]
            html = page.get(f"/jobs/{jid}").text
            assert all(str(escape(EN.pending(r))) in html for r in why), (why, html)
        stored = _stored(api, waiting)
        assert all(r["code"] != "QueuePosition" for rs in stored.values() for r in rs), stored

        written = _reasons_written(api)
        assert c.post(f"/api/v1/jobs/{waiting[0]}/cancel", headers=admin).status_code == 200
        loop.tick()
        assert _places(api, admin, waiting[1:]) == [1, 2, 3]  # moved up, their rows as they were
        assert _stored(api, waiting[1:]) == {j: stored[j] for j in waiting[1:]} and not written

        with c.app.state.platform.session() as db:  # as the code before left a row: its place stored
            db.get(Job, waiting[3]).pending_reasons = [OLD_PLACE]
            db.commit()

    with api_on(settings, FakeRuntime(settings)) as (api, admin):  # the same database and fake host: a restart
        assert _places(api, admin, waiting[1:]) == [None, None, 9]  # no cycle yet: the stored reasons alone
        api.client.app.state.loop.tick()
        assert _places(api, admin, waiting[1:]) == [1, 2, 3]
        assert _stored(api, [waiting[3]]) == {waiting[3]: stored[waiting[3]]}
