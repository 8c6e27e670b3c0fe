"""Governance's notices by e-mail, end to end to a real SMTP server (aiosmtpd): the governor warns (or only flags)
an idle job of a user who reads Chinese, and the mail that arrives is in Chinese. A flag (idle GPUs, a runtime
limit reached) also reaches the admins of the job's account (``account_flag``), each on their own preference: by
e-mail, by webhook."""

from __future__ import annotations

import threading
from http.server import HTTPServer

import pytest

from caldera.core.governance import IdleRule
from caldera.db.models import Job
from caldera.notify import outbox
from caldera.server import tenancy
from tests.conftest import free_port, make_settings
from tests.test_governance_requests import _job
from tests.test_loop_fake_runtime import _api
from tests.test_notifications import _Hook, _notifiers, _smtp, _subject

HOUR = 3600


@pytest.fixture
def mailed(tmp_path):
    port = free_port()
    settings = make_settings(tmp_path, f"sqlite:///{tmp_path / 'caldera.db'}", run_jobs_as="server",
                             smtp_host="127.0.0.1", smtp_port=port, notify_timeout_s=3,
                             webhook_allowed_networks=["127.0.0.0/8"])  # fmt: skip
    api, _, client = _api(settings)
    admin = api.login("admin", "admin-password")
    assert api.client.post("/api/v1/accounts", json={"name": "lab"}, headers=admin).status_code == 201
    owner = api.user(admin, "owner", accounts=["lab"])
    prefs = {"email": "owner@lab.example", "language": "zh"}
    assert api.client.put("/api/v1/notifications/settings", json=prefs, headers=owner).status_code == 200
    controller, inbox = _smtp(port)
    try:
        yield api, owner, client.app.state.platform, inbox
    finally:
        controller.stop()
        client.__exit__(None, None, None)


@pytest.mark.parametrize(
    ("stop", "subject", "said"),
    [
        (True, "作业 long 处于空闲状态", "将在 1m 后停止"),  # idle_warning: stopped after the grace period
        (False, "作业 long 占用着空闲的 GPU", "不会被停止"),  # idle_flag: the queue only tells
    ],
)
def test_an_idle_jobs_mail_is_in_the_users_language(mailed, stop, subject, said):
    api, owner, platform, inbox = mailed
    job = _job(api, owner)
    rule = IdleRule(enabled=True, window_s=600, grace_s=60, stop=stop)
    with platform.session() as db:
        rules = tenancy.all_queue_configs(db)["lab"].governance.model_copy(update={"idle_batch": rule})
        started = db.get(Job, job).started_at
    samples = {job: {"node-0/0": [(started + t, 0.0) for t in range(0, 1001, 10)]}}
    with platform.session() as db:
        api.client.app.state.loop.governor.apply(db, {"lab": rules}, samples, started + 1000)
        db.commit()
    notifiers = _notifiers(platform.settings)
    assert outbox.dispatch(platform.sessions, notifiers, platform.settings, now=started + 1001) == 1
    [(to, mail)] = inbox.mails
    assert to == ["owner@lab.example"] and _subject(mail) == subject
    body = mail.get_payload(decode=True).decode()
    assert "10m" in body and said in body, body
    assert not any(word in body for word in ("Your job", "GPUs", "stopped", "running")), body


def _account_admin(api, admin, name: str, prefs: dict) -> dict:
    who = api.user(admin, name, accounts=["lab"])
    assert api.client.put(f"/api/v1/accounts/lab/admins/{name}", json={"admin": True}, headers=admin).status_code == 200
    assert api.client.put("/api/v1/notifications/settings", json=prefs, headers=who).status_code == 200
    return who


def test_flags_reach_the_accounts_admins_on_their_own_preference(mailed):
    api, owner, platform, inbox = mailed
    admin = api.login("admin", "admin-password")
    _Hook.received.clear()
    hook = HTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{hook.server_port}/lab-chat"
    _account_admin(api, admin, "head", {"email": "head@lab.example", "language": "zh"})  # the default: mail
    _account_admin(api, admin, "deputy", {"email": "deputy@lab.example", "webhook_url": url,
                                          "channels": {"account_flag": ["webhook"]}})  # fmt: skip
    member = api.user(admin, "member", accounts=["lab"])
    job = _job(api, owner, notify=False)  # the owner's choice for this job is not the admins'
    governor = api.client.app.state.loop.governor
    with platform.session() as db:
        lab = tenancy.all_queue_configs(db)["lab"].governance
        started = db.get(Job, job).started_at
    flag_only = lab.model_copy(update={"idle_batch": IdleRule(enabled=True, window_s=600, grace_s=60, stop=False)})
    samples = {job: {"node-0/0": [(started + t, 0.0) for t in range(0, 1001, 10)]}}
    limited = lab.model_copy(update={"max_runtime_s": {"batch": 1800}})
    for rules, at in ((flag_only, started + 1000), (limited, started + 1800)):  # flagged idle, then stopped
        with platform.session() as db:
            governor.apply(db, {"lab": rules}, samples, at)
            db.commit()
    try:
        sent = outbox.dispatch(platform.sessions, _notifiers(platform.settings), platform.settings, now=started + 1801)
    finally:
        hook.shutdown()
    assert sent == 4  # two mails to the head, two posts to the deputy; the owner's job says no mail
    mails = sorted((to, _subject(mail), mail.get_payload(decode=True).decode()) for to, mail in inbox.mails)
    assert [(to, subject) for to, subject, _ in mails] == [(["head@lab.example"], "lab 账户中 owner 的作业 long")] * 2
    bodies = sorted(body for _, _, body in mails)
    assert "占用空闲 GPU 已达 10m" in bodies[0] and "运行时限被停止，时限为 30m" in bodies[1], bodies
    posts = [payload for _, _, payload in _Hook.received]
    assert [p["event"] for p in posts] == ["account_flag"] * 2 and {p["user"] for p in posts} == {"deputy"}
    assert "has held idle GPUs for 10m" in posts[0]["body"] and "runtime limit of 30m" in posts[1]["body"]
    items = api.client.get("/api/v1/notifications", headers=member).json()["items"]
    assert items == []  # a member who administers nothing is told nothing
