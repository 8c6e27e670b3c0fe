"""Notifications end to end: a job's end is told by e-mail to a real SMTP server (aiosmtpd) in the user's language,
a server that is down leaves the message queued and retried, a webhook gets a JSON POST and cannot be pointed at
the platform's own network, a job's notify: narrows the channels, and each user sees only their own list."""

from __future__ import annotations

import json
import sys
import threading
import time
from email import message_from_bytes
from email.header import decode_header, make_header
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from aiosmtpd.controller import Controller
from fastapi.testclient import TestClient

from caldera.core.states import JobState
from caldera.db.models import Job, OutboxMessage
from caldera.notify import outbox, registry
from caldera.notify.base import DeliveryError, Message
from caldera.notify.email import EmailNotifier
from caldera.notify.webhook import WebhookNotifier
from caldera.server.jobs import record
from tests.conftest import Api, free_port, make_settings

BATCH = {"name": "train-1", "command": "echo hi"}


class Inbox:
    def __init__(self) -> None:
        self.mails: list = []

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd's hook name
        self.mails.append((envelope.rcpt_tos, message_from_bytes(envelope.content)))
        return "250 OK"


@pytest.fixture
def smtp_port():
    return free_port()


@pytest.fixture
def platform_api(tmp_path, db_url, smtp_port):
    from caldera.server.app import create_app
    from caldera.server.platform import Platform
    from caldera.server.tenancy import bootstrap

    settings = make_settings(
        tmp_path,
        db_url,
        smtp_host="127.0.0.1",
        smtp_port=smtp_port,
        notify_timeout_s=3,
        notify_retry_base_s=60,
        notify_max_attempts=2,
        webhook_allowed_networks=["127.0.0.0/8"],
    )
    p = Platform.create(settings)
    with p.session() as db:
        bootstrap(db, "admin-password")
        db.commit()
    with TestClient(create_app(p, run_loop=False)) as client:
        yield p, Api(client)
    p.engine.dispose()


def _smtp(port: int) -> tuple[Controller, Inbox]:
    inbox = Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    return controller, inbox


def _fail_job(p, api: Api, headers: dict, **spec) -> str:
    r = api.client.post("/api/v1/jobs", json={**BATCH, **spec}, headers=headers)
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    with p.session() as db:
        job = db.get(Job, job_id)
        record(db, job, JobState.FAILED, "Failed", "exit code 3")
        db.commit()
    return job_id


def _notifiers(settings):
    return {"email": EmailNotifier(settings), "webhook": WebhookNotifier(settings)}


def _subject(mail) -> str:
    return str(make_header(decode_header(mail["Subject"])))


def test_failure_is_mailed_in_the_users_language(platform_api, smtp_port):
    p, api = platform_api
    admin = api.login("admin", "admin-password")
    alice = api.user(admin, "alice")
    r = api.client.put(
        "/api/v1/notifications/settings", json={"email": "alice@lab.example", "language": "zh"}, headers=alice
    )
    assert r.status_code == 200, r.text
    controller, inbox = _smtp(smtp_port)
    try:
        _fail_job(p, api, alice)
        assert outbox.dispatch(p.sessions, _notifiers(p.settings), p.settings) == 1
    finally:
        controller.stop()
    [(to, mail)] = inbox.mails
    assert to == ["alice@lab.example"]
    assert _subject(mail) == "作业 train-1 失败"
    assert "exit code 3" in mail.get_payload(decode=True).decode()
    listed = api.client.get("/api/v1/notifications", headers=alice).json()
    assert listed["unread"] == 1
    [item] = listed["items"]
    assert item["subject"] == "作业 train-1 失败"
    assert item["deliveries"] == [{"channel": "email", "state": "sent", "attempts": 1, "last_error": ""}]


def test_a_mail_server_that_is_down_queues_and_retries(platform_api, smtp_port):
    p, api = platform_api
    admin = api.login("admin", "admin-password")
    bob = api.user(admin, "bob")
    api.client.put("/api/v1/notifications/settings", json={"email": "bob@lab.example"}, headers=bob)
    _fail_job(p, api, bob)
    started = time.monotonic()
    assert outbox.dispatch(p.sessions, _notifiers(p.settings), p.settings) == 0  # nothing listens on the port
    assert time.monotonic() - started < p.settings.notify_timeout_s + 1
    [item] = api.client.get("/api/v1/notifications", headers=bob).json()["items"]
    [delivery] = item["deliveries"]
    assert delivery["state"] == "pending" and delivery["attempts"] == 1 and "SMTP" in delivery["last_error"]
    # not due again before its backoff
    assert outbox.dispatch(p.sessions, _notifiers(p.settings), p.settings) == 0
    with p.session() as db:
        assert db.query(OutboxMessage).one().attempts == 1
        due = db.query(OutboxMessage).one().next_try_at
    controller, inbox = _smtp(smtp_port)
    try:
        assert outbox.dispatch(p.sessions, _notifiers(p.settings), p.settings, now=due + 1) == 1
    finally:
        controller.stop()
    assert [to for to, _ in inbox.mails] == [["bob@lab.example"]]
    with p.session() as db:
        row = db.query(OutboxMessage).one()
        assert (row.state, row.attempts) == ("sent", 2)


def test_delivery_gives_up_after_the_most_attempts(platform_api):
    p, api = platform_api
    admin = api.login("admin", "admin-password")
    bob = api.user(admin, "bob")
    api.client.put("/api/v1/notifications/settings", json={"email": "bob@lab.example"}, headers=bob)
    _fail_job(p, api, bob)
    outbox.dispatch(p.sessions, _notifiers(p.settings), p.settings)
    outbox.dispatch(p.sessions, _notifiers(p.settings), p.settings, now=time.time() + 3600)
    [delivery] = api.client.get("/api/v1/notifications", headers=bob).json()["items"][0]["deliveries"]
    assert (delivery["state"], delivery["attempts"]) == ("failed", 2)


class _Hook(BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Hook.received.append((self.path, self.headers["Content-Type"], json.loads(body)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_webhook_gets_a_json_post_and_no_private_address_without_allowance(platform_api):
    p, api = platform_api
    admin = api.login("admin", "admin-password")
    carol = api.user(admin, "carol")
    _Hook.received.clear()  # the class keeps what an earlier run of this test (the other database) received
    server = HTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/hook?room=7"
    channels = {"job_failed": ["portal", "webhook"]}
    r = api.client.put("/api/v1/notifications/settings", json={"webhook_url": url, "channels": channels}, headers=carol)
    assert r.status_code == 200, r.text
    job_id = _fail_job(p, api, carol)
    try:
        assert outbox.dispatch(p.sessions, _notifiers(p.settings), p.settings) == 1
    finally:
        server.shutdown()
    [(path, ctype, payload)] = _Hook.received
    assert path == "/hook?room=7" and ctype == "application/json"
    assert payload["user"] == "carol" and payload["event"] == "job_failed" and payload["job_id"] == job_id
    # the same URL on a platform that allows no private network: refused before connecting
    strict = WebhookNotifier(p.settings.model_copy(update={"webhook_allowed_networks": []}))
    with pytest.raises(DeliveryError, match="non-public"):
        strict.deliver(Message("carol", "job_failed", "s", "b", job_id, 0.0), url)
    with pytest.raises(DeliveryError, match="non-public"):
        strict.deliver(Message("carol", "job_failed", "s", "b", job_id, 0.0), "http://localhost:1/")


def test_job_notify_false_keeps_it_in_the_portal(platform_api):
    p, api = platform_api
    admin = api.login("admin", "admin-password")
    dan = api.user(admin, "dan")
    api.client.put("/api/v1/notifications/settings", json={"email": "dan@lab.example"}, headers=dan)
    _fail_job(p, api, dan, notify=False)
    [item] = api.client.get("/api/v1/notifications", headers=dan).json()["items"]
    assert item["deliveries"] == []
    r = api.client.post("/api/v1/jobs", json={**BATCH, "notify": ["no_such_event"]}, headers=dan)
    assert r.status_code == 400


def test_each_user_sees_and_marks_only_their_own(platform_api):
    p, api = platform_api
    admin = api.login("admin", "admin-password")
    erin, frank = api.user(admin, "erin"), api.user(admin, "frank")
    _fail_job(p, api, erin)
    [item] = api.client.get("/api/v1/notifications", headers=erin).json()["items"]
    assert api.client.get("/api/v1/notifications", headers=frank).json() == {"unread": 0, "items": []}
    assert api.client.post(f"/api/v1/notifications/{item['id']}/read", headers=frank).status_code == 404
    assert api.client.post(f"/api/v1/notifications/{item['id']}/read", headers=erin).json() == {"unread": 0}


@pytest.mark.parametrize(
    "body",
    [
        {"webhook_url": "file:///etc/passwd"},
        {"webhook_url": "http://x/" + "a" * 3000},
        {"email": "a@b\r\nBcc: all@lab"},
        {"language": "fr"},
        {"channels": {"job_failed": ["sms"]}},
        {"channels": {"nothing": ["portal"]}},
    ],
)
def test_settings_refuse_bad_values(platform_api, body):
    _, api = platform_api
    headers = api.user(api.login("admin", "admin-password"), "gina")
    assert api.client.put("/api/v1/notifications/settings", json=body, headers=headers).status_code == 400


def test_a_notifier_is_a_plugin_found_by_entry_point(tmp_path, monkeypatch):
    dist = tmp_path / "site_chat-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: site-chat\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[caldera.notifiers]\nchat = site_chat:Chat\n")
    (tmp_path / "site_chat.py").write_text(
        "class Chat:\n    def __init__(self, settings):\n        self.settings = settings\n"
        "    def deliver(self, message, target):\n        pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "chat" in registry.available()
    made = registry.create_notifiers(make_settings(tmp_path))
    assert type(made["chat"]).__name__ == "Chat"
    sys.modules.pop("site_chat", None)


def test_portal_page_lists_and_saves_settings(platform_api):
    from tests.portal import browser_for, post_form

    p, api = platform_api
    api.user(api.login("admin", "admin-password"), "hana")
    hana = api.login("hana", "password-123")
    _fail_job(p, api, hana)
    browser = browser_for(api.client, "hana", "password-123")
    html = browser.get("/notifications").text
    assert 'id="unread" class="count">1<' in html and "Job train-1 failed" in html
    form = {"email": "hana@lab.example", "webhook_url": "", "language": "zh", "job_failed.email": "on"}
    assert post_form(browser, "/notifications/settings", form).status_code == 303
    prefs = api.client.get("/api/v1/notifications/settings", headers=hana).json()
    assert prefs["language"] == "zh" and prefs["channels"]["job_failed"] == ["email"]
    assert prefs["channels"]["job_succeeded"] == []
    bad = post_form(browser, "/notifications/settings", {**form, "webhook_url": "gopher://x"})
    assert bad.status_code == 400
    assert post_form(browser, "/notifications/read-all", {}).status_code == 303
    assert api.client.get("/api/v1/notifications", headers=hana).json()["unread"] == 0
