"""Governance's notices by e-mail, end to end to a real SMTP server (aiosmtpd): the governor warns (or only flags)
an idle job of a user who reads Chinese, and the mail that arrives is in Chinese."""

from __future__ import annotations

import pytest

from caldera.core.governance import IdleRule
from caldera.db.models import Job
from caldera.notify import outbox
from caldera.server import tenancy
from tests.conftest import free_port, make_settings
from tests.test_governance_requests import _job
from tests.test_loop_fake_runtime import _api
from tests.test_notifications import _notifiers, _smtp, _subject

HOUR = 3600


@pytest.fixture
def mailed(tmp_path):
    port = free_port()
    settings = make_settings(tmp_path, f"sqlite:///{tmp_path / 'caldera.db'}", run_jobs_as="server",
                             smtp_host="127.0.0.1", smtp_port=port, notify_timeout_s=3)  # fmt: skip
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
