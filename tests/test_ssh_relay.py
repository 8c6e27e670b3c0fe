"""``caldera ssh`` with OpenSSH's own client (``ssh``, ``scp``, ``rsync`` with ``caldera ssh --stdio`` as the
ProxyCommand), against a real `caldera up` as root, with each of the job's SSH servers (OpenSSH's ``sshd -i``,
asyncssh's): a command runs in the job as the job's uid; files go both ways; another user's key, another user's
token, a key removed, no token are refused; nothing listens for it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests import needs
from tests.conftest import ServerProcess, free_port, kill_job_processes, server_env, traversable, wait_for
from tests.needs import root_user  # noqa: F401 - fixture
from tests.test_exec_api import _login, _os_uid, _sleeper, _user

pytestmark = [pytest.mark.usefixtures("root_user"), pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)]
SERVER_SOFTWARE = {"auto": "OpenSSH_", "asyncssh": "AsyncSSH_"}  # what each says in its version line


@pytest.fixture(params=sorted(SERVER_SOFTWARE))
def server(request, tmp_path, db_url):
    """`caldera up` (process runtime) whose jobs' SSH server is OpenSSH's (``auto`` on a host with sshd and
    nss_wrapper) or asyncssh's."""
    if request.param == "auto":
        needs.program("sshd", "openssh-server")
        needs.require(any(Path(d).glob("libnss_wrapper.so") for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64")),
                      "nss_wrapper (apt install libnss-wrapper)")  # fmt: skip
    env = {**server_env(tmp_path, db_url), "CALDERA_SSH_SERVER": request.param,
           "CALDERA_METRICS_PORT": str(free_port())}  # fmt: skip
    srv = ServerProcess(traversable(tmp_path) / "data", free_port(), env).start()
    srv.ssh_software = SERVER_SOFTWARE[request.param]
    yield srv
    srv.stop()
    kill_job_processes(srv.data_dir)


def _key(tmp_path: Path, name: str) -> Path:
    for program in ("ssh", "scp", "ssh-keygen", "rsync"):
        needs.program(program, "openssh-client rsync")
    needs.module("asyncssh")
    path = tmp_path / f"id_{name}"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(path)], check=True)
    return path


def _register(srv, h, key: Path) -> int:
    r = httpx.post(f"{srv.url}/api/v1/ssh-keys", json={"public_key": key.with_suffix(".pub").read_text()}, headers=h)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _ssh_options(tmp_path: Path, config: Path, key: Path) -> list[str]:
    """What `caldera ssh-config` prints, as options, with this test's CLI credentials and key."""
    proxy = f"env CALDERA_CONFIG_DIR={config} {sys.executable} -m caldera.cli.main ssh --stdio %n"
    return [
        "-F", "none", "-o", f"ProxyCommand={proxy}", "-o", "HostKeyAlias=caldera-jobs",
        "-o", f"UserKnownHostsFile={tmp_path / 'known_hosts'}", "-o", "StrictHostKeyChecking=accept-new",
        "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-i", str(key),
    ]  # fmt: skip


def _ssh(srv, opts: list[str], jid: str, *command: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ssh", *opts, f"caldera@caldera-{jid}", *command], capture_output=True, text=True, timeout=timeout,
        env=srv.env,
    )  # fmt: skip


def _alices_running_job(server, tmp_path) -> tuple[str, list[str]]:
    """alice, her registered key and a running job of hers: the job's id and ssh's options to reach it."""
    alice = _user(server, "alice")
    key = _key(tmp_path, "alice")
    _register(server, alice, key)
    return _sleeper(server, alice), _ssh_options(tmp_path, _login(server, tmp_path, "alice"), key)


def test_ssh_scp_and_rsync_through_the_relay(server, tmp_path) -> None:
    jid, opts = _alices_running_job(server, tmp_path)

    r = _ssh(server, ["-v", *opts], jid, "id -u; echo $HOME; ls /proc | grep -c '^[0-9]'; exit 4")
    assert r.returncode == 4, r.stderr
    assert f"remote software version {server.ssh_software}" in r.stderr  # the server this test is for
    uid, home, nprocs = r.stdout.split()
    assert int(uid) == _os_uid(server, "alice") != 0
    assert home == str(server.data_dir / "workspaces" / "alice")
    assert int(nprocs) < 15  # the job's own PID namespace, not the host's processes

    # scp both ways (SFTP, OpenSSH's default) and the legacy scp protocol, then rsync over the same alias
    payload = tmp_path / "payload.bin"
    payload.write_bytes(os.urandom(3 * 2**20 + 17))
    for legacy in ([], ["-O"]):
        r = subprocess.run(["scp", *legacy, *opts, str(payload), f"caldera@caldera-{jid}:up.bin"], capture_output=True,
                           text=True, timeout=120, env=server.env)  # fmt: skip
        assert r.returncode == 0, r.stderr
        landed = server.data_dir / "workspaces" / "alice" / "up.bin"
        assert landed.read_bytes() == payload.read_bytes() and landed.stat().st_uid == _os_uid(server, "alice")
        back = tmp_path / f"down{len(legacy)}.bin"
        r = subprocess.run(["scp", *legacy, *opts, f"caldera@caldera-{jid}:up.bin", str(back)], capture_output=True,
                           text=True, timeout=120, env=server.env)  # fmt: skip
        assert r.returncode == 0 and back.read_bytes() == payload.read_bytes(), r.stderr
    rsh = " ".join(["ssh", *(f"'{o}'" if " " in o else o for o in opts)])
    r = subprocess.run(["rsync", "-a", "-e", rsh, str(payload), f"caldera@caldera-{jid}:synced.bin"],
                       capture_output=True, text=True, timeout=120, env=server.env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert (server.data_dir / "workspaces" / "alice" / "synced.bin").read_bytes() == payload.read_bytes()


def test_other_keys_tokens_and_removed_keys_are_refused(server, tmp_path) -> None:
    alice, bob = _user(server, "alice"), _user(server, "bob")
    alice_key, bob_key = _key(tmp_path, "alice"), _key(tmp_path, "bob")
    alice_key_id = _register(server, alice, alice_key)
    _register(server, bob, bob_key)
    jid = _sleeper(server, alice)
    alice_cli, bob_cli = _login(server, tmp_path, "alice"), _login(server, tmp_path, "bob")

    # bob's key through alice's own login: the server in alice's job knows only alice's keys
    r = _ssh(server, _ssh_options(tmp_path, alice_cli, bob_key), jid, "id")
    assert r.returncode == 255 and "Permission denied (publickey)" in r.stderr, r.stderr
    # alice's key through bob's login: the relay never reaches alice's job for bob
    r = _ssh(server, _ssh_options(tmp_path, bob_cli, alice_key), jid, "id")
    assert r.returncode == 255 and "404" in r.stderr, r.stderr
    # and with alice's key and login, it works
    r = _ssh(server, _ssh_options(tmp_path, alice_cli, alice_key), jid, "echo in")
    assert (r.returncode, r.stdout) == (0, "in\n"), r.stderr
    # a key alice removed lets nobody in any more, in the job that was started with it too
    assert httpx.delete(f"{server.url}/api/v1/ssh-keys/{alice_key_id}", headers=alice).status_code in (200, 204)
    r = _ssh(server, _ssh_options(tmp_path, alice_cli, alice_key), jid, "echo in")
    assert r.returncode == 255, r.stdout

    # the websocket itself: no token, another user's token, a browser's cookie, another origin
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    url = f"ws://127.0.0.1:{server.port}/api/v1/jobs/{jid}/ssh"
    for headers, status in (({}, 401), (bob, 404), ({**alice, "Origin": "http://evil.example"}, 403)):
        with pytest.raises(InvalidStatus) as refusal, connect(url, additional_headers=headers):
            pass
        assert refusal.value.response.status_code == status, headers


def _listening_inodes() -> set[str]:
    found = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                found.add(fields[9])
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "00010000":  # __SO_ACCEPTCON: a listening socket
            found.add(fields[6])
    return found


def _processes_of(uid: int) -> dict[int, str]:
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and entry.stat().st_uid == uid:
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
    return found


def test_the_jobs_ssh_server_listens_nowhere(server, tmp_path) -> None:
    """While a session is open, its server is a process of the job's user on a pipe: no socket of it listens,
    so another user's job has nothing to connect to."""
    jid, opts = _alices_running_job(server, tmp_path)
    proc = subprocess.Popen(["ssh", *opts, f"caldera@caldera-{jid}", "sleep 8; echo done"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=server.env)  # fmt: skip
    uid = _os_uid(server, "alice")
    servers = wait_for(
        lambda: [
            pid for pid, cmd in _processes_of(uid).items() if cmd.startswith("sshd") or "--authorized-keys" in cmd
        ],
        what="the job's SSH server",
    )
    listening = _listening_inodes()
    for pid in _processes_of(uid):
        try:
            links = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        except OSError:
            continue
        sockets = {link[len("socket:[") : -1] for link in links if link.startswith("socket:[")}
        assert not sockets & listening, (pid, _processes_of(uid).get(pid))
    assert servers
    out, errout = proc.communicate(timeout=60)
    assert out == "done\n", errout


@pytest.fixture
def container_server(tmp_path, db_url):
    """Jobs in the platform's default image (``caldera images bootstrap``): its recipe has OpenSSH's server."""
    needs.podman()
    env = {**server_env(tmp_path, db_url), "CALDERA_RUNTIME": "container", "CALDERA_METRICS_PORT": str(free_port())}
    srv = ServerProcess(traversable(tmp_path) / "data", free_port(), env).start()
    yield srv
    srv.stop()
    kill_job_processes(srv.data_dir)


def test_ssh_and_scp_into_a_container_job_on_the_default_image_use_its_sshd(container_server, tmp_path) -> None:
    server = container_server
    jid, opts = _alices_running_job(server, tmp_path)

    r = _ssh(server, ["-v", *opts], jid, "id -u; test -e /run/.containerenv && echo in-a-container")
    assert r.returncode == 0, r.stderr
    assert "remote software version OpenSSH_" in r.stderr
    assert r.stdout.split() == [str(_os_uid(server, "alice")), "in-a-container"]

    payload = tmp_path / "payload.bin"
    payload.write_bytes(os.urandom(2**20 + 5))
    r = subprocess.run(["scp", *opts, str(payload), f"caldera@caldera-{jid}:up.bin"], capture_output=True, text=True,
                       timeout=120, env=server.env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    landed = server.data_dir / "workspaces" / "alice" / "up.bin"
    assert landed.read_bytes() == payload.read_bytes() and landed.stat().st_uid == _os_uid(server, "alice")
