"""`caldera up` as a real process: the CLI end to end, restarts after SIGKILL, the Jupyter proxy."""

import asyncio
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import websockets

from caldera.runtime.local import procs
from tests.conftest import lab_client, wait_for


def cli(server, *args, check=True, timeout=60):
    r = subprocess.run(
        [sys.executable, "-m", "caldera.cli.main", *args],
        env=server.env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check:
        assert r.returncode == 0, (args, r.stdout, r.stderr)
    return r


def token(server, username="admin", password="admin-password"):
    pair = httpx.post(server.url + "/api/v1/auth/login", json={"username": username, "password": password}).json()
    return {"Authorization": f"Bearer {pair['access_token']}"}


def job(server, h, jid):
    return httpx.get(f"{server.url}/api/v1/jobs/{jid}", headers=h).json()


def until(server, h, jid, states, timeout=60):
    return wait_for(lambda: (j := job(server, h, jid))["state"] in states and j, timeout, what=f"{jid} in {states}")


def test_cli_end_to_end(server, tmp_path):
    cli(server, "login", "--url", server.url, "-u", "admin", "-p", "admin-password")
    cred = tmp_path / "cli-config" / "credentials.json"
    assert oct(cred.stat().st_mode & 0o777) == "0o600" and json.loads(cred.read_text())["token"].startswith("cal_")
    spec = tmp_path / "job.yaml"
    spec.write_text(
        "name: count\ncommand: sh -c 'for i in 1 2 3; do echo tick $i; sleep 0.5; done'\nresources: {gpu: 1}\n"
    )
    out = cli(server, "submit", str(spec)).stdout
    jid = out.split("submitted ")[1].split()[0]
    follow = cli(server, "logs", "-f", jid, timeout=90).stdout
    assert follow.split("\n")[:3] == ["tick 1", "tick 2", "tick 3"]
    assert cli(server, "wait", jid, "--timeout", "30").returncode == 0
    listing = cli(server, "ls").stdout
    assert jid in listing and "Succeeded" in listing
    desc = cli(server, "describe", jid).stdout
    for word in ("Submitted", "Admitted", "Scheduled", "Completed", "gpu"):
        assert word in desc
    assert cli(server, "logs", jid).stdout.startswith("tick 1")  # also after the job ended

    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ncommand: 'true'\nresources: {gpu: 64}\n")
    r = cli(server, "submit", str(bad), check=False)
    assert r.returncode == 1 and "resources" in r.stderr

    long = tmp_path / "long.yaml"
    long.write_text("name: long\ncommand: sleep 120\n")
    lid = cli(server, "submit", str(long)).stdout.split("submitted ")[1].split()[0]
    h = token(server)
    until(server, h, lid, {"Running"})
    cli(server, "cancel", lid)
    assert until(server, h, lid, {"Cancelled"})["state"] == "Cancelled"


def test_logs_follow_says_why_a_job_waits_then_follows_it(server, tmp_path):
    cli(server, "login", "--url", server.url, "-u", "admin", "-p", "admin-password")
    h = token(server)
    submit = lambda spec: httpx.post(f"{server.url}/api/v1/jobs", json=spec, headers=h).json()["id"]  # noqa: E731
    blocker = submit({"name": "blocker", "command": ["sleep", "120"], "resources": {"gpu": 2}})
    until(server, h, blocker, {"Running"})
    waiter = submit({"name": "waiter", "command": ["echo", "finally"], "resources": {"gpu": 1}})
    follow = subprocess.Popen(
        [sys.executable, "-m", "caldera.cli.main", "logs", "-f", waiter],
        env=server.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = follow.stderr.readline()  # said while the job waits, before any output
        httpx.post(f"{server.url}/api/v1/jobs/{blocker}/cancel", headers=h)
        out, said = follow.communicate(timeout=90)
    finally:
        follow.kill()
    said = first + said
    assert follow.returncode == 0, said
    assert "waiting" in said and "GPU" in said, (said, out)
    assert out.strip() == "finally"


def test_sigkill_restart_loses_no_job(server, tmp_path):
    h = token(server)
    post = lambda spec: httpx.post(server.url + "/api/v1/jobs", json=spec, headers=h).json()["id"]  # noqa: E731
    # the survivor runs until the test says so (a file in its working directory): however slow the restart is
    wait_for_go = "for i in $(seq 1200); do [ -e go ] && break; sleep 0.1; done; echo survived"
    survivor = post({"name": "survivor", "command": ["sh", "-c", wait_for_go], "resources": {"gpu": 2}})
    victim = post({"name": "victim", "command": ["sleep", "300"]})
    until(server, h, survivor, {"Running"})
    until(server, h, victim, {"Running"})
    waiting = post({"name": "waiting", "command": ["echo", "ran later"], "resources": {"gpu": 1}})
    assert job(server, h, waiting)["state"] == "Queued"
    victim_pids = [json.loads(p.read_text())["shim_pid"] for p in (tmp_path / "data" / "runs" / victim).rglob("*.pid")]
    assert victim_pids, "the runtime records pids in the run dir"

    registry = _registry_of(tmp_path)  # where docker-registry is installed, the platform runs its own
    assert bool(registry) == bool(shutil.which("docker-registry"))
    server.kill()
    # the registry dies with the server, however the server died (else it keeps the port with the old config)
    wait_for(lambda: all(not procs.is_alive(pid, start) for pid, start in registry), 15, what="registry gone")
    for pid in victim_pids:  # the victim's processes die while the server is down
        try:
            os.killpg(pid, 9)
        except ProcessLookupError:
            pass
    server.start()
    h = token(server)
    lost = until(server, h, victim, {"Lost"})
    assert lost["events"][-1]["reason"] in ("ProcessGone", "ReattachFailed")
    assert "Reattached" in [e["reason"] for e in job(server, h, survivor)["events"]]
    (tmp_path / "data" / "workspaces" / "admin" / "jobs" / survivor / "go").touch()
    until(server, h, survivor, {"Succeeded"}, timeout=60)
    assert httpx.get(f"{server.url}/api/v1/jobs/{survivor}/logs", headers=h).text.strip() == "survived"
    assert until(server, h, waiting, {"Succeeded"})["state"] == "Succeeded"


def _registry_of(tmp_path) -> list[tuple[int, int | None]]:
    """(pid, start) of the docker-registry processes serving the configuration under ``tmp_path``."""
    conf = str(tmp_path / "data" / "registry" / "config.yml").encode()
    found = []
    for pid in (int(n) for n in os.listdir("/proc") if n.isdigit()):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if conf in argv:
            found.append((pid, procs.start_time(pid)))
    return found


def lab_xsrf(client: httpx.Client, base: str, h: dict) -> dict:
    """What Lab's page does before any POST: load a page (Jupyter sets its _xsrf cookie), send it back as a header."""
    client.get(f"{base}/lab", headers=h)
    return {**h, "X-XSRFToken": client.cookies.get("_xsrf", domain=urlsplit(base).hostname)}


@pytest.mark.jupyter
def test_jupyter_through_the_proxy(server):
    pytest.importorskip("jupyterlab")
    h = token(server)
    jid = httpx.post(server.url + "/api/v1/jobs", json={"name": "lab", "kind": "jupyter"}, headers=h).json()["id"]
    until(server, h, jid, {"Running"}, timeout=120)
    lab = server.lab_url(jid)  # this lab's own origin
    base = f"{lab}/jobs/{jid}/lab"
    anonymous = lab_client()

    # no login: no way in; a browser is sent to the platform, which sends it to its login page
    assert anonymous.get(f"{base}/api/status").status_code == 401
    r = anonymous.get(f"{base}/", headers={"Accept": "text/html"})
    assert r.status_code == 303 and r.headers["location"] == f"{server.url}/jobs/{jid}/lab/"
    r = httpx.get(r.headers["location"])
    assert r.status_code == 303 and r.headers["location"].startswith("/login")
    # the platform's origin serves no lab content, not even to its owner: it hands out a ticket for this lab's origin
    r = httpx.get(f"{server.url}/jobs/{jid}/lab/api/status", headers=h)
    assert r.status_code == 303 and r.headers["location"].startswith(f"{lab}/_caldera/lab-login?ticket=")
    # another user: the job does not exist for them
    httpx.post(server.url + "/api/v1/users", json={"username": "mallory", "password": "password-123"}, headers=h)
    assert anonymous.get(f"{base}/api/status", headers=token(server, "mallory", "password-123")).status_code == 404

    with lab_client() as client:
        assert client.post(f"{base}/api/kernels", json={"name": "python3"}, headers=h).status_code == 403  # XSRF
        r = client.post(f"{base}/api/kernels", json={"name": "python3"}, headers=lab_xsrf(client, base, h), timeout=60)
        assert r.status_code == 201, r.text
        kernel = r.json()["id"]
    # the lab's token never leaves the platform: not in the job, its events, its logs or proxied pages
    lab_token = next((server.data_dir / "runs" / jid).rglob("jupyter.token")).read_text().strip()
    assert len(lab_token) >= 32
    seen = [
        httpx.get(f"{server.url}/api/v1/jobs/{jid}", headers=h).text,
        httpx.get(f"{server.url}/api/v1/jobs/{jid}/logs", headers=h).text,
        anonymous.get(f"{base}/lab", headers=h).text,
    ]
    assert all(lab_token not in text for text in seen)

    async def run_code() -> str:
        url = f"ws://{jid}.lab.localhost:{server.lab_port}/jobs/{jid}/lab/api/kernels/{kernel}/channels"
        async with websockets.connect(url, additional_headers=h, host="127.0.0.1") as ws:
            msg_id = uuid.uuid4().hex
            await ws.send(
                json.dumps(
                    {
                        "header": {
                            "msg_id": msg_id,
                            "msg_type": "execute_request",
                            "username": "t",
                            "session": "s",
                            "version": "5.3",
                        },
                        "parent_header": {},
                        "metadata": {},
                        "channel": "shell",
                        "content": {
                            "code": "print(6*7)",
                            "silent": False,
                            "store_history": False,
                            "user_expressions": {},
                            "allow_stdin": False,
                        },
                    }
                )
            )
            while True:
                m = json.loads(await asyncio.wait_for(ws.recv(), 60))
                if m.get("parent_header", {}).get("msg_id") == msg_id and m["msg_type"] == "stream":
                    return m["content"]["text"]

    assert asyncio.run(run_code()).strip() == "42"

    # a browser: platform login, then the ticket trip to the lab origin, which sets a cookie for this job only
    with lab_client() as browser:
        browser.get(server.url + "/login")  # sets the CSRF cookie the form sends back
        r = browser.post(
            server.url + "/login",
            data={
                "username": "admin",
                "password": "admin-password",
                "next": f"/jobs/{jid}/lab/api/status",
                "csrf_token": browser.cookies["caldera_csrf"],
            },
            follow_redirects=True,
        )
        assert r.status_code == 200 and "kernels" in r.json()
        # with the lab cookie, a request from any other origin, or from none, is refused
        others = (f"http://{jid}.lab.localhost:1", server.lab_url("0123456789"), server.url)
        for origin in (*({"Origin": other} for other in others), {}):
            r = browser.post(f"{base}/api/kernels", json={"name": "python3"}, headers=origin)
            assert r.status_code == 403 and r.json()["detail"] == "cross-origin request refused", origin
        # from the lab origin itself, Jupyter's own XSRF check still applies
        r = browser.post(f"{base}/api/kernels", json={"name": "python3"}, headers={"Origin": lab})
        assert r.status_code == 403 and "cross-origin" not in r.text
        lab_cookies = [c for c in browser.cookies.jar if c.name == "caldera_lab"]  # host-only: no Domain attribute
        assert [(c.domain, c.path, c.domain_specified) for c in lab_cookies] == [
            (f"{jid}.lab.localhost", f"/jobs/{jid}/lab/", False)
        ]
        assert all(c.name != "caldera_session" for c in browser.cookies.jar if c.domain.endswith("localhost"))
    httpx.post(f"{server.url}/api/v1/jobs/{jid}/cancel", headers=h)
    until(server, h, jid, {"Cancelled"})
