"""Storage spaces mounted into a job by a real `caldera up` as root, under the process and the container runtime:
read-only unless granted, in the job's own mount namespace only; the host path of an account's space is closed to
jobs; a mount the user may not have, or any job while the personal space is over its quota, is refused at
submission with its reason."""

from __future__ import annotations

import json
import os
import textwrap

import httpx
import pytest

from tests import needs
from tests.conftest import ServerProcess, free_port, kill_job_processes, server_env, traversable
from tests.needs import root_user  # noqa: F401 - fixture
from tests.test_server_process import token, until

pytestmark = [pytest.mark.usefixtures("root_user"), pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)]


@pytest.fixture(params=["local", "container"])
def server(request, tmp_path, db_url):
    if request.param == "container":
        needs.podman()
    env = {**server_env(tmp_path, db_url), "CALDERA_RUNTIME": request.param}
    srv = ServerProcess(traversable(tmp_path) / "data", free_port(), env).start()
    yield srv
    srv.stop()
    kill_job_processes(srv.data_dir)


PROBE = textwrap.dedent("""
    import json, os, sys
    out = {}
    def attempt(name, fn):
        try:
            out[name] = fn()
        except OSError as exc:
            out[name] = type(exc).__name__ + ":" + os.strerror(exc.errno)
    attempt("shared", lambda: open("/tmp/shared/data.txt").read())
    attempt("public", lambda: open("/tmp/pub/readme.txt").read())
    attempt("write shared", lambda: open("/tmp/shared/planted.txt", "w").write("x"))
    attempt("write shared rw", lambda: open("/tmp/shared-rw/from-job.txt", "w").write("written by a member's job"))
    attempt("write public", lambda: os.mkdir("/tmp/pub/planted"))
    attempt("write mine", lambda: open("/tmp/me/out.txt", "w").write("from the job"))
    attempt("host path", lambda: os.listdir(sys.argv[1]))
    print(json.dumps(out))
""")


def _user(server, admin, name):
    r = httpx.post(server.url + "/api/v1/users", json={"username": name, "password": "password-123"}, headers=admin)
    assert r.status_code == 201, r.text
    return token(server, name, "password-123")


def _put(server, h, space, path, data: bytes):
    r = httpx.post(f"{server.url}/api/v1/spaces/{space}/uploads", json={"path": path, "size": len(data)}, headers=h)
    r = httpx.patch(f"{server.url}/api/v1/spaces/{space}/uploads/{r.json()['id']}", content=data,
                    headers={**h, "Upload-Offset": "0"})  # fmt: skip
    assert r.json()["done"], r.text


def test_spaces_mounted_into_a_process_job(server):
    admin = token(server)
    alice, bob = _user(server, admin, "alice"), _user(server, admin, "bob")
    httpx.post(f"{server.url}/api/v1/accounts", json={"name": "vision"}, headers=admin)
    httpx.post(f"{server.url}/api/v1/accounts/vision/members", json={"username": "alice"}, headers=admin)
    _put(server, admin, "account:vision", "data.txt", b"the lab's dataset")
    _put(server, admin, "public", "readme.txt", b"for everyone")
    mounts = [{"space": "account:vision", "at": "/tmp/shared"}, {"space": "public", "at": "/tmp/pub"},
              {"space": "personal", "at": "/tmp/me", "writable": True},
              {"space": "account:vision", "at": "/tmp/shared-rw", "writable": True}]  # fmt: skip
    host = str(server.data_dir / "spaces" / "account" / "vision" / "data")
    spec = {"name": "probe", "command": ["python3", "-c", PROBE, host], "mounts": mounts,
            "resources": {"cpu": 0.5, "memory_mib": 256}}  # fmt: skip
    r = httpx.post(f"{server.url}/api/v1/jobs", json=spec, headers=alice)
    assert r.status_code == 201, r.text
    jid = r.json()["id"]
    job = until(server, alice, jid, ("Succeeded", "Failed"), timeout=90)
    log = httpx.get(f"{server.url}/api/v1/jobs/{jid}/logs", headers=alice).text
    assert job["state"] == "Succeeded", (log, job["events"][-1]["message"])
    got = json.loads(log.strip().splitlines()[-1])
    assert got["shared"] == "the lab's dataset" and got["public"] == "for everyone"
    assert got["write shared"] == "OSError:Read-only file system"
    assert got["write public"] == "OSError:Read-only file system"
    assert got["write mine"] == len("from the job")
    # alice may write the account's space (a member, mode rw): her job writes it as her uid, the others read it
    assert got["write shared rw"] == len("written by a member's job")
    r = httpx.get(f"{server.url}/api/v1/spaces/account:vision/files", params={"path": "from-job.txt"}, headers=admin)
    assert r.text == "written by a member's job"
    # only through the mount: the space's host path is behind a root-only folder (or, with the data directory
    # below /tmp as here, not in the job's view at all)
    assert got["host path"] in ("PermissionError:Permission denied", "FileNotFoundError:No such file or directory")
    gate = os.stat(server.data_dir / "spaces" / "account" / "vision")
    assert (gate.st_uid, gate.st_mode & 0o777) == (0, 0o700)
    assert (server.data_dir / "workspaces" / "alice" / "out.txt").read_text() == "from the job"
    assert not os.path.exists("/tmp/shared/data.txt")  # the host's /tmp never saw the mount
    assert not os.path.exists("/tmp/me")

    # refused at submission, with the reason
    cases = [
        (bob, [{"space": "account:vision", "at": "/data"}], "no access to account:vision"),
        (bob, [{"space": "personal:alice", "at": "/data"}], "no access to personal:alice"),
        (bob, [{"space": "account:vision", "at": "/data", "writable": True}], "no access to account:vision"),
        (alice, [{"space": "public", "at": "/data", "writable": True}], "may read public but not change it"),
        (alice, [{"space": "account:ghost", "at": "/data"}], "no space account:ghost"),
    ]
    for who, bad, why in cases:
        r = httpx.post(f"{server.url}/api/v1/jobs", json={**spec, "mounts": bad}, headers=who)
        assert r.status_code == 400 and why in r.text, r.text
        assert r.json()["errors"][0]["field"] == "mounts.0.space"
    for at in ("/etc", "relative", "/a/../etc", "/x:rw", "/x,y", "/proc/1", "/opt", "/home/alice"):
        r = httpx.post(f"{server.url}/api/v1/jobs", json={**spec, "mounts": [{"space": "public", "at": at}]},
                       headers=alice)  # fmt: skip
        assert r.status_code == 400 and r.json()["errors"][0]["field"] == "mounts.0.at", (at, r.text)
    # a personal space over its quota takes no job that writes to it
    httpx.patch(f"{server.url}/api/v1/spaces/personal:alice", json={"quota_files": 0}, headers=admin)
    httpx.post(f"{server.url}/api/v1/spaces/personal:alice/reconcile", headers=admin)
    r = httpx.post(f"{server.url}/api/v1/jobs", json=spec, headers=alice)
    assert r.status_code == 400 and "quota" in r.text
    assert [e["field"] for e in r.json()["errors"]] == ["workdir", "mounts.2.space"]
    r = httpx.post(f"{server.url}/api/v1/jobs", json={**spec, "mounts": []}, headers=alice)
    assert r.status_code == 400 and "personal space" in r.text  # every job works in it
