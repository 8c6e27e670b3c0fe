"""Issue 22: the labs' server says why it refuses in the reader's language (a browser: a page in the language its
Accept-Language asks for, the lab's origin keeping no language cookie; a script: the English detail and a code), and
closing a lab's tab ends its websocket relay without a traceback."""

from __future__ import annotations

import asyncio
import logging

import pytest
import websockets
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from caldera.server import lab_proxy
from caldera.server.lab_app import create_lab_app
from caldera.server.lab_errors import MESSAGES
from caldera.server.web import i18n

SQLITE = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
HTML = {"Accept": "text/html,application/xhtml+xml"}


def _lab(api) -> TestClient:
    return TestClient(create_lab_app(api.client.app.state.platform))


def _host(api, job: str) -> str:
    return api.client.app.state.platform.settings.lab_url(job).split("://", 1)[1]


@SQLITE
def test_a_refusal_reads_in_the_browsers_language_and_a_script_gets_the_code(api):
    lab = _lab(api)
    host = _host(api, "nosuchjob1")
    zh = lab.get("/jobs/nosuchjob1/lab/", headers={**HTML, "Host": host, "Accept-Language": "zh-CN,zh;q=0.9"})
    assert zh.status_code == 404 and "此地址没有实验环境" in zh.text and "no lab at this address" not in zh.text
    assert 'lang="zh-CN"' in zh.text and "<script" not in zh.text
    en = lab.get("/jobs/nosuchjob1/lab/", headers={**HTML, "Host": host, "Accept-Language": "en-US"})
    assert en.status_code == 404 and "no lab at this address" in en.text and "此地址" not in en.text
    script = lab.get("/jobs/nosuchjob1/lab/", headers={"Host": host})
    assert script.json() == {"detail": "no lab at this address", "code": "NoLab"}


def test_every_lab_refusal_has_a_chinese_sentence_with_the_same_values():
    tr = i18n.translations("zh")
    for code, msgid in MESSAGES.items():
        assert tr.gettext(msgid) != msgid, code
        assert sorted(msgid.count(f"%({k})s") for k in ("job", "state", "why")) == sorted(
            tr.gettext(msgid).count(f"%({k})s") for k in ("job", "state", "why")
        ), code


class _ClosedTab:
    """A browser's side of the relay after its tab closed: every send and close raises WebSocketDisconnect, as
    Starlette does once the client has gone."""

    async def receive(self):
        return {"type": "websocket.disconnect", "code": 1001}

    async def send_text(self, _):
        raise WebSocketDisconnect(1006)

    send_bytes = send_text

    async def close(self, code: int = 1000):
        raise WebSocketDisconnect(1006)


class _Kernel:
    """Jupyter's side: one message, then its connection closes."""

    def __init__(self) -> None:
        self.closed = False

    def __aiter__(self):
        return self._messages()

    async def _messages(self):
        yield '{"msg_type": "status"}'
        raise websockets.ConnectionClosedOK(None, None)

    async def send(self, _):
        pass

    async def close(self):
        self.closed = True


def test_closing_a_lab_tab_ends_the_relay_without_a_traceback(caplog):
    kernel = _Kernel()
    with caplog.at_level(logging.DEBUG):
        asyncio.run(lab_proxy._pump(_ClosedTab(), kernel))  # the old relay raised WebSocketDisconnect here
    assert kernel.closed
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
