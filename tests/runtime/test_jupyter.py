"""Jupyter jobs: STARTING until Lab answers, a token only the proxy knows, a kernel that runs code."""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import stat
import uuid
from datetime import datetime, timezone
from pathlib import Path

import httpx
import pytest

from caldera.runtime.base import Phase
from caldera.runtime.local import jupyter, procs
from caldera.runtime.local.runtime import LocalRuntime

from .conftest import wait_for, wait_terminal

pytestmark = [pytest.mark.jupyter,
              pytest.mark.skipif(importlib.util.find_spec("jupyterlab") is None, reason="jupyterlab not installed"),
              pytest.mark.skipif(importlib.util.find_spec("websockets") is None, reason="websockets not installed")]

BASE = "/jobs/lab1/lab/"


def _execute(url: str, headers: dict[str, str], code: str, timeout: float = 60.0) -> str:
    """Run ``code`` over the kernel's websocket channels and return what it printed."""
    from websockets.sync.client import connect

    session = uuid.uuid4().hex
    msg_id = uuid.uuid4().hex
    request = {"header": {"msg_id": msg_id, "username": "test", "session": session, "msg_type": "execute_request",
                          "version": "5.3", "date": datetime.now(timezone.utc).isoformat()},
               "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
               "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {},
                           "allow_stdin": False, "stop_on_error": True}}
    out = []
    with connect(url, additional_headers=headers, open_timeout=timeout, max_size=None) as ws:
        ws.send(json.dumps(request))
        while True:
            msg = json.loads(ws.recv(timeout=timeout))
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                raise AssertionError(msg["content"])
            elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                return "".join(out)


def _wait_running(runtime, h) -> None:
    wait_for(lambda: runtime.observe(h).phase is Phase.RUNNING, timeout=90, interval=0.2, what="Lab to answer")


def test_lab_runs_code_behind_its_token(launch, runtime, settings, monkeypatch) -> None:
    h = launch(job_id="lab1", kind="jupyter", base_url=BASE)
    with monkeypatch.context() as m:   # as long as Lab does not answer, the job is starting and has no endpoint
        m.setattr(jupyter, "ready", lambda *a, **k: False)
        assert runtime.observe(h).phase is Phase.STARTING
        assert runtime.endpoints(h) == []
    _wait_running(runtime, h)

    [ep] = runtime.endpoints(h)
    assert (ep.name, ep.host, ep.base_url) == ("lab", "127.0.0.1", BASE)
    token = ep.headers["Authorization"].removeprefix("token ")
    assert len(token) >= 32
    run_dir = Path(h.data["run_dir"])
    assert stat.S_IMODE((run_dir / "jupyter.token").stat().st_mode) == 0o600
    assert token not in json.dumps(h.data) and token not in (run_dir / "meta.json").read_text()
    assert LocalRuntime(settings).endpoints(h) == [ep]          # a restarted server finds it too

    root = f"http://127.0.0.1:{ep.port}{BASE}"
    with httpx.Client(timeout=30) as http:
        assert http.get(root + "api/status").status_code in (401, 403)            # no token, no entry
        # what the proxy sends: the token, Host = the upstream, a foreign Origin dropped or not (token auth wins)
        r = http.get(root + "api/status", headers={**ep.headers, "Origin": "https://caldera.example"})
        assert r.status_code == 200
        # DNS-rebinding protection stays on: the proxy must rewrite Host
        assert http.get(root + "api/status", headers={**ep.headers, "Host": "caldera.example"}).status_code == 403
        r = http.post(root + "api/kernels", headers=ep.headers, json={"name": "python3"})
        assert r.status_code == 201, r.text
        kernel = r.json()["id"]

    ws_url = f"ws://127.0.0.1:{ep.port}{BASE}api/kernels/{kernel}/channels?session_id={uuid.uuid4().hex}"
    assert _execute(ws_url, ep.headers, "print(6*7)") == "42\n"
    kernel_pid = int(_execute(ws_url, ep.headers, "import os; print(os.getpid())"))
    kernel_start = procs.start_time(kernel_pid)

    runtime.stop(h, grace_s=10)
    obs = wait_terminal(runtime, h, timeout=30)
    assert obs.phase in (Phase.SUCCEEDED, Phase.FAILED)
    assert runtime.endpoints(h) == []
    wait_for(lambda: not procs.is_alive(kernel_pid, kernel_start), timeout=15, what="the kernel to go")
    log = b"".join(runtime.logs(h)).decode()
    assert "Jupyter Server" in log and token not in log


def test_kernels_die_with_a_killed_lab(launch, runtime) -> None:
    """Kernels run in sessions of their own; when Lab dies abruptly they are found by the job's run tag."""
    h = launch(job_id="lab2", kind="jupyter", base_url="/jobs/lab2/lab")
    _wait_running(runtime, h)
    [ep] = runtime.endpoints(h)
    assert ep.base_url == "/jobs/lab2/lab/"
    root = f"http://127.0.0.1:{ep.port}{ep.base_url}"
    r = httpx.post(root + "api/kernels", headers=ep.headers, json={"name": "python3"}, timeout=30)
    assert r.status_code == 201, r.text
    ws_url = f"ws://127.0.0.1:{ep.port}{ep.base_url}api/kernels/{r.json()['id']}/channels"
    kernel_pid = int(_execute(ws_url, ep.headers, "import os; print(os.getpid())"))
    kernel_start = procs.start_time(kernel_pid)
    assert procs.stat(kernel_pid).pgrp != h.data["ranks"][0]["pid"]   # outside the shim's process group
    lab = json.loads((Path(h.data["run_dir"]) / "rank-0.pid").read_text())
    os.kill(lab["child_pid"], signal.SIGKILL)
    obs = wait_terminal(runtime, h)
    assert (obs.phase, obs.exit_code) == (Phase.FAILED, 137)
    wait_for(lambda: not procs.is_alive(kernel_pid, kernel_start), timeout=15, what="the kernel to go")
