"""SSH and terminals through the platform: scp throughput through the relay against the same SSH server without it
and against OpenSSH over plain loopback, and the round trip of a keystroke in a terminal (the job page's path)
against a local PTY.

    python benchmarks/bench_ssh.py [--mib 1024] [--keys 300] [--server auto|asyncssh]

Needs root (jobs run as their owners), OpenSSH's client and asyncssh; OpenSSH's sshd and nss_wrapper for the
``auto`` server and the loopback baseline. Starts `caldera up` (process runtime) in a temporary directory, a user
with an SSH key and a running job of hers, then:

* scp of a ``mib`` MiB file up and down through ``caldera ssh --stdio`` (CLI -> websocket -> the platform ->
  the job's SSH server, started in the job as her uid: ``--server``, CALDERA_SSH_SERVER), against scp to the same
  server started directly as her uid as the ProxyCommand (a pipe on this host: what the relay adds), and against
  scp to OpenSSH's sshd listening on 127.0.0.1 (a root sshd of this script's, the issue's baseline);
* ``keys`` single keystrokes sent over the exec websocket to a shell's terminal in the job, each timed until its
  echo comes back, against the same on a PTY of this process (the kernel's echo: nothing but the terminal).
Prints medians and p95s. Exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.conftest import ServerProcess, free_port, kill_job_processes, server_env, traversable  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
LAUNCHER = REPO / "caldera" / "runtime" / "job_sshd.py"
ASYNCSSH_SERVER = REPO / "caldera" / "runtime" / "job_asyncssh.py"


def _scp(opts: list[str], src: str, dst: str, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(["scp", "-q", *opts, src, dst], check=True, env=env, timeout=3600)
    return time.perf_counter() - t0


def _common(tmp: Path, key: Path, proxy: str) -> list[str]:
    known = f"UserKnownHostsFile={tmp / 'known_hosts'}"
    return ["-F", "none", "-o", f"ProxyCommand={proxy}", "-o", known, "-o", "StrictHostKeyChecking=no",
            "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-i", str(key)]  # fmt: skip


def _direct_proxy(tmp: Path, pub: str, server: str, uid: int) -> str:
    """The job's SSH server as ssh's ProxyCommand, as the user (``setpriv``), with no relay between."""
    home = tmp / "direct"
    home.mkdir()
    os.chown(home, uid, uid)
    script = tmp / "direct-proxy.sh"
    script.write_text(
        f"#!/bin/sh\nexec setpriv --reuid={uid} --regid={uid} --clear-groups env HOME={home} "
        f"{sys.executable} -c \"$(cat {LAUNCHER})\" --server {server} --authorized-keys '{pub.strip()}' "
        f'--asyncssh-source "$(cat {ASYNCSSH_SERVER})"\n'
    )
    script.chmod(0o755)
    return str(script)


def _loopback_sshd(tmp: Path, pub: str) -> tuple[subprocess.Popen, int]:
    """OpenSSH's sshd on 127.0.0.1 (root, this key only): scp over plain loopback, the baseline."""
    conf = tmp / "loopback"
    conf.mkdir()
    (conf / "authorized_keys").write_text(pub)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(conf / "host_key")], check=True)
    port = free_port()
    (conf / "sshd_config").write_text(
        f"ListenAddress 127.0.0.1:{port}\nHostKey {conf / 'host_key'}\nAuthorizedKeysFile {conf / 'authorized_keys'}\n"
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n"
        "PidFile none\nStrictModes no\nSubsystem sftp internal-sftp\n"
    )
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # root sshd's privilege separation directory
    proc = subprocess.Popen(["/usr/sbin/sshd", "-D", "-f", str(conf / "sshd_config")])
    time.sleep(0.5)
    return proc, port


def _throughput(name: str, opts: list[str], remote: str, payload: Path, tmp: Path, env: dict[str, str]) -> None:
    """scp up to ``remote`` (host:path) and back."""
    mib = payload.stat().st_size / 2**20
    up = _scp(opts, str(payload), remote, env)
    down = _scp(opts, remote, str(tmp / "down.bin"), env)
    assert (tmp / "down.bin").stat().st_size == payload.stat().st_size
    print(f"  {name:<34} up {mib / up:7.1f} MiB/s   down {mib / down:7.1f} MiB/s")


def _keystrokes_local(n: int) -> list[float]:
    master, slave = os.openpty()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        os.write(master, b"x")
        select.select([master], [], [], 5)
        os.read(master, 1024)
        times.append(time.perf_counter() - t0)
    os.close(master)
    os.close(slave)
    return times


def _keystrokes_terminal(server: ServerProcess, token: str, jid: str, n: int) -> list[float]:
    from websockets.sync.client import connect

    url = f"ws://127.0.0.1:{server.port}/api/v1/jobs/{jid}/exec"
    times = []
    with connect(url, additional_headers={"Authorization": f"Bearer {token}"}, compression=None) as ws:
        ws.send(json.dumps({"argv": ["cat"], "tty": True}))
        time.sleep(1)
        for _ in range(n):
            t0 = time.perf_counter()
            ws.send(b"x")
            ws.recv(timeout=10)
            times.append(time.perf_counter() - t0)
    return times


def _ms(times: list[float]) -> str:
    q = statistics.quantiles(times, n=20)
    return f"median {statistics.median(times) * 1000:6.2f} ms   p95 {q[18] * 1000:6.2f} ms"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=1024)
    ap.add_argument("--keys", type=int, default=300)
    ap.add_argument("--server", choices=("auto", "asyncssh"), default="auto", help="the job's SSH server")
    args = ap.parse_args()
    if os.geteuid() != 0 or not shutil.which("scp"):
        print("needs root and OpenSSH's scp")
        return 0
    tmp = traversable(Path(tempfile.mkdtemp(prefix="bench-ssh-")))
    env = {**server_env(tmp, f"sqlite:///{tmp / 'caldera.db'}"), "CALDERA_METRICS_PORT": str(free_port())}
    env["CALDERA_SSH_SERVER"] = args.server
    env["PYTHONPATH"] = str(REPO)
    server = ServerProcess(tmp / "data", free_port(), env).start()
    try:
        admin = httpx.post(f"{server.url}/api/v1/auth/login", json={"username": "admin", "password": "admin-password"})
        h = {"Authorization": f"Bearer {admin.json()['access_token']}"}
        httpx.post(f"{server.url}/api/v1/users", json={"username": "alice", "password": "password-123"}, headers=h)
        login = httpx.post(f"{server.url}/api/v1/auth/login", json={"username": "alice", "password": "password-123"})
        token = login.json()["access_token"]
        alice = {"Authorization": f"Bearer {token}"}
        key = tmp / "id_alice"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        pub = key.with_suffix(".pub").read_text()
        httpx.post(f"{server.url}/api/v1/ssh-keys", json={"public_key": pub}, headers=alice).raise_for_status()
        spec = {"name": "bench", "command": ["sleep", "3600"], "resources": {"cpu": 0.5, "memory_mib": 256}}
        jid = httpx.post(f"{server.url}/api/v1/jobs", json=spec, headers=alice).json()["id"]
        while httpx.get(f"{server.url}/api/v1/jobs/{jid}", headers=alice).json()["state"] != "Running":
            time.sleep(0.3)
        subprocess.run([sys.executable, "-m", "caldera.cli.main", "login", "--url", server.url, "-u", "alice", "-p",
                        "password-123"], env=env, check=True, capture_output=True)  # fmt: skip
        payload = tmp / "payload.bin"
        with open(payload, "wb") as f:
            for _ in range(args.mib):
                f.write(os.urandom(2**20))
        print(f"scp of {args.mib} MiB (the machine is shared: figures vary run to run)")
        relay = _common(tmp, key, f"{sys.executable} -m caldera.cli.main ssh --stdio %n")
        _throughput("through the relay", relay, f"caldera@caldera-{jid}:bench-up.bin", payload, tmp, env)
        direct = _common(
            tmp, key, _direct_proxy(tmp, pub, args.server, (server.data_dir / "workspaces" / "alice").stat().st_uid)
        )
        _throughput("same SSH server over a pipe", direct, "caldera@direct:bench-up.bin", payload, tmp, env)
        if os.path.exists("/usr/sbin/sshd"):
            sshd, port = _loopback_sshd(tmp, pub)
            try:
                loopback = [*_common(tmp, key, "none"), "-P", str(port)]
                _throughput(
                    "OpenSSH sshd on 127.0.0.1 (TCP)", loopback, f"root@127.0.0.1:{tmp}/up.bin", payload, tmp, env
                )
            finally:
                sshd.terminate()
        print(f"keystroke round trip ({args.keys} keys)")
        print(f"  {'terminal (exec websocket, PTY)':<34} {_ms(_keystrokes_terminal(server, token, jid, args.keys))}")
        print(f"  {'local PTY':<34} {_ms(_keystrokes_local(args.keys))}")
    finally:
        server.stop()
        kill_job_processes(server.data_dir)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
