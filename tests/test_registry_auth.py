"""The image registry asks for the platform's login: without it (as a job of the process runtime, which shares the
host's network, would try) nothing is read or pushed, and the login itself is the platform's alone."""

import json
import os
import shutil
import textwrap
from pathlib import Path

import httpx
import pytest

from caldera.config import Settings
from caldera.images import registry
from tests.conftest import ROOT, RUN_JOBS_AS, ServerProcess, free_port, kill_job_processes, traversable
from tests.test_isolation import _post, _user
from tests.test_server_process import token, until

needs_registry = pytest.mark.skipif(shutil.which("docker-registry") is None, reason="needs Debian's docker-registry")


@needs_registry
def test_the_registry_answers_only_the_platforms_login(tmp_path):
    s = Settings(data_dir=tmp_path, registry_port=free_port())
    proc = registry.start_local(s)
    try:
        base = registry.url(s)
        assert httpx.get(f"{base}/v2/_catalog").status_code == 401
        assert httpx.get(f"{base}/v2/_catalog", auth=(registry.USERNAME, "guess")).status_code == 401
        assert httpx.post(f"{base}/v2/user/ana/x/blobs/uploads/").status_code == 401
        assert httpx.get(f"{base}/v2/_catalog", auth=registry.auth(s)).status_code == 200
        creds = registry.credentials_path(s)
        modes = {p.name: p.stat().st_mode & 0o777 for p in (creds.parent, creds, creds.with_name("htpasswd"))}
        assert modes == {"registry": 0o700, "credentials.json": 0o600, "htpasswd": 0o600}
        password = registry.auth(s)[1]
        assert password not in (creds.parent / "registry.log").read_text(errors="replace")
        assert password not in creds.with_name("htpasswd").read_text()  # a bcrypt hash, not the password
    finally:
        proc.terminate()
        proc.wait(10)


ATTACK = textwrap.dedent("""
    import json, os, urllib.request, urllib.error
    t = json.loads(os.environ["TARGETS"])
    out = {}
    def status(method, url):
        try:
            return urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=10).status
        except urllib.error.HTTPError as exc:
            return exc.code
    out["catalogue"] = status("GET", t["url"] + "/v2/_catalog")
    out["push"] = status("POST", t["url"] + "/v2/user/alice/torch/blobs/uploads/")
    for name in ("credentials", "authfile"):
        try:
            out[name] = "LEAKED: " + open(t[name]).read()[:40]
        except PermissionError:
            out[name] = "denied"
        except FileNotFoundError:
            out[name] = "absent"
        except OSError as exc:
            out[name] = "MISSING: " + repr(exc)
    print(json.dumps(out))
""")


@needs_registry
@pytest.mark.skipif(not ROOT, reason="jobs run as their owners only under a root server")
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_process_job_can_neither_push_nor_read_the_registry(tmp_path, db_url):
    port = free_port()
    env = {
        **os.environ,
        "CALDERA_INITIAL_ADMIN_PASSWORD": "admin-password",
        "CALDERA_DATABASE_URL": db_url,
        "CALDERA_SCHEDULE_INTERVAL_S": "0.3",
        "CALDERA_RUNTIME": "local",
        "CALDERA_REGISTRY_PORT": str(port),
        "CALDERA_CONFIG_DIR": str(tmp_path / "cli-config"),
        "CALDERA_RUN_JOBS_AS": RUN_JOBS_AS,
    }
    server = ServerProcess(traversable(tmp_path) / "data", free_port(), env)
    server.start()
    try:
        bob = _user(server, token(server), "bob")
        s = Settings(data_dir=server.data_dir, registry_port=port)
        registry.authfile(s)  # the file buildah pushes with exists, so reading it is a real attempt
        targets = {
            "url": registry.url(s),
            "credentials": str(registry.credentials_path(s)),
            "authfile": str(registry.credentials_path(s).with_name("auth.json")),
        }
        jid = _post(
            server,
            bob,
            {"name": "attack", "command": ["python3", "-c", ATTACK], "env": {"TARGETS": json.dumps(targets)}},
        )
        done = until(server, bob, jid, {"Succeeded", "Failed"}, timeout=90)
        log = httpx.get(f"{server.url}/api/v1/jobs/{jid}/logs", headers=bob).text
        assert done["state"] == "Succeeded", log
        seen = json.loads(log.strip().splitlines()[-1])
        # a file below the host's /tmp (this test's data dir) is not there at all in the job's own /tmp; elsewhere
        # (a real data dir) it is there and denied. Either way the file exists on the host
        expect = {n: "absent" if targets[n].startswith("/tmp/") else "denied" for n in ("credentials", "authfile")}
        assert all(Path(targets[n]).is_file() for n in expect)
        assert seen == {"catalogue": 401, "push": 401, **expect}
        assert httpx.get(f"{registry.url(s)}/v2/_catalog", auth=registry.auth(s)).status_code == 200
    finally:
        server.stop()
        kill_job_processes(server.data_dir)
