"""Governance in the portal, over the fake runtime: a user asks from their job's page, their account's admin
decides on the approvals page (another member sees nothing to decide and cannot), refusals come back in the page's
language, and an idle warning shows on the home page and the job page."""

from __future__ import annotations

from html import escape

from caldera.core.governance import IdleRule
from caldera.db.models import Job
from caldera.server import tenancy
from tests.portal import browser_for, post_form
from tests.test_governance_requests import _job, world  # noqa: F401 - the fixture

HOUR = 3600


def _zh(browser) -> None:
    assert post_form(browser, "/language", {"lang": "zh", "next": "/"}).status_code == 303


def test_ask_from_the_job_page_and_decide_on_the_approvals_page(world):  # noqa: F811
    api, people, _ = world
    job = _job(api, people["owner"])
    owner = browser_for(api.client, "owner", "password-123")
    boss = browser_for(api.client, "boss", "password-123")
    stranger = browser_for(api.client, "stranger", "password-123")
    assert 'id="ask"' in owner.get(f"/jobs/{job}").text
    r = post_form(owner, f"/jobs/{job}/requests", {"kind": "extend", "hours": "2", "reason": "one more epoch"})
    assert r.status_code == 303, r.text
    page = owner.get(f"/jobs/{job}").text
    assert 'id="job-requests"' in page and "one more epoch" in page
    (req,) = api.client.get("/api/v1/requests", headers=people["owner"]).json()
    # another member of the account neither sees nor decides it
    assert f'data-request="{req["id"]}"' not in stranger.get("/approvals").text
    r = post_form(stranger, f"/approvals/{req['id']}", {"decision": "approve", "note": ""})
    assert r.status_code == 400 and "no request" in r.text
    # the account's admin does, in Chinese
    _zh(boss)
    listing = boss.get("/approvals").text
    assert f'data-request="{req["id"]}"' in listing and "批准" in listing and "延长" in listing
    r = post_form(boss, f"/approvals/{req['id']}", {"decision": "approve", "note": "ok"})
    assert r.status_code == 303
    assert "已批准" in boss.get("/approvals").text
    assert api.client.get("/api/v1/requests", headers=people["owner"]).json()[0]["state"] == "approved"
    assert 'id="extended"' in owner.get(f"/jobs/{job}").text
    # a refusal on the job page, in the page's language: a second lock while one waits
    _zh(owner)
    assert post_form(owner, f"/jobs/{job}/requests", {"kind": "lock", "hours": "1", "reason": "r"}).status_code == 303
    r = post_form(owner, f"/jobs/{job}/requests", {"kind": "lock", "hours": "1", "reason": "r"})
    assert r.status_code == 400 and "仍在等待审批" in r.text and "still waiting" not in r.text


def test_an_idle_warning_shows_on_home_and_the_job_page_in_both_languages(world):  # noqa: F811
    api, people, platform = world
    job = _job(api, people["owner"])
    rule = IdleRule(enabled=True, window_s=600, grace_s=3600, stop=True)
    with platform.session() as db:
        rules = tenancy.all_queue_configs(db)["lab"].governance.model_copy(update={"idle_batch": rule})
        started = db.get(Job, job).started_at
    samples = {job: {"node-0/0": [(started + t, 0.0) for t in range(0, 1001, 10)]}}
    governor = api.client.app.state.loop.governor
    with platform.session() as db:
        governor.apply(db, {"lab": rules}, samples, started + 1000)
        db.commit()
    owner = browser_for(api.client, "owner", "password-123")
    home = owner.get("/").text
    assert f'data-job="{job}" data-reason="IdleWarning"' in home and "stopped in 1h 0m unless used" in home
    assert "stopped in 1h 0m unless used" in owner.get(f"/jobs/{job}").text
    _zh(owner)
    home = owner.get("/").text
    assert escape("其 GPU 在 10m 内平均利用率为 0%；若不使用，将在 1h 0m 后停止") in home
    assert "unless used" not in home

    # admins see it among the idle GPUs on the requests page, with its owner
    admin = browser_for(api.client, "admin", "admin-password")
    listing = admin.get("/approvals").text
    assert listing.count('id="idle-jobs"') == 1 and f'<tr data-job="{job}">' in listing and "<td>owner</td>" in listing
    assert 'id="idle-jobs"' not in owner.get("/approvals").text
