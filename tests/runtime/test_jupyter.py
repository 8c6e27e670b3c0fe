"""Jupyter jobs: STARTING until Lab answers, a token only the proxy knows, a kernel that runs code."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import stat
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from caldera.runtime.base import Phase
from caldera.runtime.local import jupyter, procs
from caldera.runtime.local.runtime import LocalRuntime

from .conftest import host_pid, namespace_pids, wait_for, wait_terminal

pytestmark = [
    pytest.mark.jupyter,
    pytest.mark.skipif(importlib.util.find_spec("jupyterlab") is None, reason="jupyterlab not installed"),
    pytest.mark.skipif(importlib.util.find_spec("websockets") is None, reason="websockets not installed"),
]

BASE = "/jobs/lab1/lab/"


def _execute(ep, path: str, code: str, timeout: float = 60.0) -> str:
    """Run ``code`` over the kernel's websocket channels (on Lab's Unix socket) and return what it printed."""
    from websockets.sync.client import unix_connect

    session = uuid.uuid4().hex
    msg_id = uuid.uuid4().hex
    request = {
        "header": {
            "msg_id": msg_id,
            "username": "test",
            "session": session,
            "msg_type": "execute_request",
            "version": "5.3",
            "date": datetime.now(UTC).isoformat(),
        },
        "parent_header": {},
        "metadata": {},
        "channel": "shell",
        "buffers": [],
        "content": {
            "code": code,
            "silent": False,
            "store_history": False,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": True,
        },
    }
    out = []
    with unix_connect(
        ep.socket, f"ws://localhost{path}", additional_headers=ep.headers, open_timeout=timeout, max_size=None
    ) as ws:
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


def _http(ep) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=ep.socket), base_url="http://localhost", timeout=30)


def _new_kernel(http: httpx.Client, ep) -> str:
    """What the Lab page does: fetch a page (Jupyter sets its _xsrf cookie), then POST with the XSRF header."""
    http.get(ep.base_url + "lab", headers=ep.headers)
    xsrf = http.cookies["_xsrf"]
    r = http.post(
        ep.base_url + "api/kernels",
        json={"name": "python3"},
        headers={"Cookie": f"{ep.headers['Cookie']}; _xsrf={xsrf}", "X-XSRFToken": xsrf},
    )
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _wait_running(runtime, h) -> None:
    wait_for(lambda: runtime.observe(h).phase is Phase.RUNNING, timeout=90, interval=0.2, what="Lab to answer")


def test_lab_listens_only_on_a_private_socket(launch, runtime, settings, monkeypatch) -> None:
    h = launch(job_id="lab1", kind="jupyter", base_url=BASE)
    with monkeypatch.context() as m:  # as long as Lab does not answer, the job is starting and has no endpoint
        m.setattr(jupyter, "login", lambda *a, **k: None)
        assert runtime.observe(h).phase is Phase.STARTING
        assert runtime.endpoints(h) == []
    _wait_running(runtime, h)

    [ep] = runtime.endpoints(h)
    assert (ep.name, ep.base_url) == ("lab", BASE) and ep.socket
    scratch = Path(h.data["scratch"])
    assert stat.S_ISSOCK(os.stat(ep.socket).st_mode) and stat.S_IMODE(os.stat(ep.socket).st_mode) == 0o600
    assert stat.S_IMODE(scratch.stat().st_mode) == 0o700
    lab_pid = json.loads((Path(h.data["run_dir"]) / "rank-0.pid").read_text())["child_pid"]
    assert listening_tcp(lab_pid) == []  # no TCP port at all
    token = (Path(h.data["run_dir"]) / "jupyter.token").read_text().strip()
    assert len(token) >= 32
    assert stat.S_IMODE((Path(h.data["run_dir"]) / "jupyter.token").stat().st_mode) == 0o600
    # once Lab read them, the token and the cookie secret are gone from what the job can read
    runtime_dir = scratch / h.data["lab_runtime"]
    assert not (scratch / "lab-token").exists() and not (runtime_dir / "jupyter_cookie_secret").exists()
    for leak in (
        json.dumps(h.data),
        (Path(h.data["run_dir"]) / "meta.json").read_text(),
        ep.headers["Cookie"],
        Path(f"/proc/{lab_pid}/environ").read_bytes().decode(errors="replace"),
        Path(f"/proc/{lab_pid}/cmdline").read_bytes().decode(errors="replace"),
    ):
        assert token not in leak
    assert LocalRuntime(settings).endpoints(h)[0].socket == ep.socket  # a restarted server finds it, logs in again
    # the platform reaches Lab through its own link in the root-only run directory: the job replacing its socket
    # with a symlink to another socket of the host (a decoy here) redirects nothing, a restarted server included
    assert Path(ep.socket).parent == Path(h.data["run_dir"]) and Path(ep.socket).samefile(h.data["socket"])
    decoy = socket.socket(socket.AF_UNIX)
    decoy.bind(str(scratch / "decoy.sock"))
    decoy.listen()
    decoy.setblocking(False)
    os.rename(h.data["socket"], scratch / "moved.sock")
    os.symlink(scratch / "decoy.sock", h.data["socket"])
    with _http(LocalRuntime(settings).endpoints(h)[0]) as http:
        assert http.get(BASE + "api/status", headers=ep.headers).status_code == 200
    with pytest.raises(BlockingIOError):
        decoy.accept()
    os.unlink(h.data["socket"])
    os.rename(scratch / "moved.sock", h.data["socket"])
    decoy.close()

    with _http(ep) as http:
        assert http.get(BASE + "api/status").status_code in (401, 403)  # no login, no entry
        assert http.get(BASE + "api/status", headers=ep.headers).status_code == 200
        # DNS-rebinding protection stays on: the proxy must send Host localhost
        assert http.get(BASE + "api/status", headers={**ep.headers, "Host": "caldera.example"}).status_code == 403
        # Jupyter's XSRF check stays on for the platform's login: a POST without the _xsrf pair is refused
        assert http.post(BASE + "api/kernels", headers=ep.headers, json={"name": "python3"}).status_code == 403
        kernel = _new_kernel(http, ep)

    path = f"{BASE}api/kernels/{kernel}/channels?session_id={uuid.uuid4().hex}"
    assert _execute(ep, path, "print(6*7)") == "42\n"
    kernel_pid = host_pid(h, int(_execute(ep, path, "import os; print(os.getpid())")))
    kernel_start = procs.start_time(kernel_pid)
    # finding 4: the kernel's channels are Unix sockets in the job's own runtime directory (0700 chain), so
    # another user's job can neither find them in /proc/net/tcp nor subscribe to iopub
    conn = json.loads((runtime_dir / f"kernel-{kernel}.json").read_text())
    assert conn["transport"] == "ipc" and conn["ip"].startswith("/tmp/")  # the job's own /tmp is runtime_dir's tmp
    prefix = Path(conn["ip"]).name
    for channel in ("shell", "iopub", "stdin", "control", "hb"):
        assert stat.S_ISSOCK((runtime_dir / f"{prefix}-{conn[channel + '_port']}").stat().st_mode), channel
    job = namespace_pids(h)
    assert kernel_pid in job.values() and lab_pid in job.values() and listening_tcp(lab_pid) == []
    # what is left on TCP is ipykernel's pipe for output of forked subprocesses (PULL; it drops messages without
    # the kernel's random key): tried as an attacker would, subscribing to every TCP port of the job gives nothing
    _subscribe_to_everything(job.values(), lambda: _execute(ep, path, "print('private output')"))
    runtime.stop(h, grace_s=10)
    obs = wait_terminal(runtime, h, timeout=30)
    assert obs.phase in (Phase.SUCCEEDED, Phase.FAILED)
    assert runtime.endpoints(h) == []
    wait_for(lambda: not procs.is_alive(kernel_pid, kernel_start), timeout=15, what="the kernel to go")
    log = b"".join(runtime.logs(h)).decode()
    assert "Jupyter Server" in log and token not in log


def _subscribe_to_everything(pids, act) -> None:
    import zmq

    ctx = zmq.Context()
    try:
        ports = {int(addr.split(":")[1], 16) for pid in pids for addr in listening_tcp(pid)}
        subs = []
        for port in ports:
            sub = ctx.socket(zmq.SUB)
            sub.linger = 0
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.connect(f"tcp://127.0.0.1:{port}")
            subs.append(sub)
        time.sleep(1)  # a subscription takes a moment to reach a publisher
        assert act() == "private output\n"
        poller = zmq.Poller()
        for sub in subs:
            poller.register(sub, zmq.POLLIN)
        assert poller.poll(2000) == [], ports
    finally:
        ctx.destroy(linger=0)


def listening_tcp(pid: int) -> list[str]:
    """The TCP sockets ``pid`` listens on, from /proc (inodes of its fds against /proc/net/tcp*)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    listening = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                listening.append(cols[1])
    return listening


def test_kernels_die_with_a_killed_lab(launch, runtime) -> None:
    """Kernels run in sessions of their own; when Lab dies abruptly they are found by the job's run tag."""
    h = launch(job_id="lab2", kind="jupyter", base_url="/jobs/lab2/lab")
    _wait_running(runtime, h)
    [ep] = runtime.endpoints(h)
    assert ep.base_url == "/jobs/lab2/lab/"
    with _http(ep) as http:
        kernel = _new_kernel(http, ep)
    code = "import os; print(os.getpid())"
    kernel_pid = host_pid(h, int(_execute(ep, f"{ep.base_url}api/kernels/{kernel}/channels", code)))
    kernel_start = procs.start_time(kernel_pid)
    assert procs.stat(kernel_pid).pgrp != h.data["ranks"][0]["pid"]  # outside the shim's process group
    lab = json.loads((Path(h.data["run_dir"]) / "rank-0.pid").read_text())
    os.kill(lab["child_pid"], signal.SIGKILL)
    obs = wait_terminal(runtime, h)
    assert (obs.phase, obs.exit_code) == (Phase.FAILED, 137)
    wait_for(lambda: not procs.is_alive(kernel_pid, kernel_start), timeout=15, what="the kernel to go")
