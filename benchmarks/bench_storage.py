"""Storage spaces: upload and download throughput of one large file through the API (resumable chunks, the SDK)
and through WebDAV (curl as the client), against a plain local copy of the same file, under two conditions:

- cached: the file read is in the page cache and nothing is fsync'd (a memory copy, at best);
- disk: the file read was evicted from the page cache (fsync'd, then ``posix_fadvise(DONTNEED)``) and the file
  written is fsync'd before the clock stops, for the copy and for every transfer alike.

Each figure is the median of ``--rounds`` runs, the runs of one round one after another (copy, API up, API down,
WebDAV up, WebDAV down), with the CPU seconds the server and the client spent. Then the first page of a folder of
many files, and the reconciliation walk that keeps usage right without a walk per request.

    python benchmarks/bench_storage.py [--size-mib 2048] [--files 100000] [--chunk-mib 64] [--rounds 3] [--settle-s 10]

Starts `caldera up` in a temporary directory (same disk as the copy), then prints one line per figure (and, on
stderr, one per transfer as it is measured). Exits 0.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from caldera.client import Client  # noqa: E402
from tests.conftest import ServerProcess, free_port, kill_job_processes, traversable  # noqa: E402


def _admin(server: ServerProcess) -> tuple[dict[str, str], str]:
    """The admin's login header and a personal token of theirs (for the SDK)."""
    login = httpx.post(f"{server.url}/api/v1/auth/login", json={"username": "admin", "password": "admin-password"})
    h = {"Authorization": f"Bearer {login.json()['access_token']}"}
    return h, httpx.post(f"{server.url}/api/v1/tokens", json={"name": "bench"}, headers=h).json()["token"]


def _server(tmp: Path) -> ServerProcess:
    env = {
        **os.environ,
        "CALDERA_INITIAL_ADMIN_PASSWORD": "admin-password",
        # as the environment says: root whose Python lies in a private home (0700) runs jobs as the server
        "CALDERA_RUN_JOBS_AS": os.environ.get("CALDERA_RUN_JOBS_AS") or ("owner" if os.geteuid() == 0 else "server"),
        "CALDERA_DATABASE_URL": f"sqlite:///{tmp / 'caldera.db'}",
        "CALDERA_NODE_NAME": "node-0",
        "CALDERA_METRICS_PORT": str(free_port()),
        "CALDERA_PROMETHEUS_PORT": str(free_port()),
        "CALDERA_REGISTRY_PORT": str(free_port()),
        "CALDERA_STORAGE_QUOTA_BYTES": str(2**40),
        "CALDERA_STORAGE_QUOTA_FILES": str(10**7),
    }
    return ServerProcess(traversable(tmp) / "data", free_port(), env).start()


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _evict(path: Path) -> None:
    """Out of the page cache: the next read comes from the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _warm(path: Path) -> None:
    with path.open("rb") as fh:
        while fh.read(1 << 24):
            pass


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _cpu_s(pid: int) -> float:
    """User and system CPU seconds of a process so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _my_cpu_s() -> float:
    """This process's CPU seconds and its children's (curl)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@dataclass
class Transfer:
    """One figure: ``run`` reads ``source`` and writes ``target``."""

    name: str
    source: Path
    target: Path
    run: Callable[[], object]
    drop: tuple[Path, ...] = ()
    runs: list[tuple[float, float, float]] = field(default_factory=list)  # (seconds, server CPU s, client CPU s)

    def measure(self, disk: bool, server_pid: int, settle_s: float) -> None:
        (_evict if disk else _warm)(self.source)
        os.sync()  # no earlier run's dirty pages written back during this one
        time.sleep(settle_s)  # see --settle-s
        server_cpu, client_cpu = _cpu_s(server_pid), _my_cpu_s()
        seconds = _timed(lambda: (self.run(), disk and _fsync(self.target)))
        self.runs.append((seconds, _cpu_s(server_pid) - server_cpu, _my_cpu_s() - client_cpu))

    def median(self) -> tuple[float, float, float]:
        return statistics.median_low(self.runs)


def _transfers(tmp: Path, src: Path, home: Path, sdk: Client, server: ServerProcess, token: str, chunk: int):
    """The copy and the four transfers of one round, in order; each download's files are removed after it."""
    dav = f"{server.url}/dav/personal"
    curl = ["curl", "--silent", "--fail", "--user", f"admin:{token}"]
    up, down = home / "api.bin", tmp / "api-back.bin"
    dav_up, dav_down = home / "dav.bin", tmp / "dav-back.bin"
    return [
        Transfer(
            "local copy",
            src,
            tmp / "copy.bin",
            lambda: shutil.copyfile(src, tmp / "copy.bin"),
            drop=(tmp / "copy.bin",),
        ),
        Transfer(
            f"API upload (SDK, {chunk >> 20} MiB chunks)",
            src,
            up,
            lambda: sdk.upload(src, "api.bin", chunk_bytes=chunk),
        ),
        Transfer("API download (SDK)", up, down, lambda: sdk.download("api.bin", down), drop=(up, down)),
        Transfer(
            "WebDAV upload (curl, one PUT)",
            src,
            dav_up,
            lambda: subprocess.run(
                [*curl, "--output", "/dev/null", "--upload-file", str(src), f"{dav}/dav.bin"], check=True
            ),
        ),
        Transfer(
            "WebDAV download (curl)",
            dav_up,
            dav_down,
            lambda: subprocess.run([*curl, "--output", str(dav_down), f"{dav}/dav.bin"], check=True),
            drop=(dav_up, dav_down),
        ),
    ]


def _throughput(args: argparse.Namespace, tmp: Path, src: Path, server: ServerProcess, token: str) -> None:
    size = args.size_mib * 2**20
    sdk = Client(server.url, token, timeout=600)
    home = server.data_dir / "workspaces" / "admin"
    for disk in (False, True):
        print("disk: the file read evicted from the page cache, the file written fsync'd" if disk else
              "cached: the file read in the page cache, nothing fsync'd")  # fmt: skip
        transfers = _transfers(tmp, src, home, sdk, server, token, args.chunk_mib * 2**20)
        for round_no in range(1, args.rounds + 1):
            for transfer in transfers:
                transfer.measure(disk, server.proc.pid, args.settle_s)
                print(f"    round {round_no}/{args.rounds}, {transfer.name}: {transfer.runs[-1][0]:.2f} s",
                      file=sys.stderr, flush=True)  # fmt: skip
                for path in transfer.drop:
                    path.unlink()
        copy = transfers[0].median()[0]
        for transfer in transfers:
            seconds, server_cpu, client_cpu = transfer.median()
            print(f"  {transfer.name:34s} {size / seconds / 2**20:7.1f} MiB/s ({seconds:5.2f} s, median of "
                  f"{args.rounds})  {copy / seconds:4.0%} of the copy's speed   CPU s: server {server_cpu:5.2f}, "
                  f"client {client_cpu:5.2f}")  # fmt: skip


def _listing(args: argparse.Namespace, server: ServerProcess, h: dict[str, str]) -> None:
    many = server.data_dir / "workspaces" / "admin" / "many"
    many.mkdir()
    for i in range(args.files):
        (many / f"f{i:07d}").touch()
    first = []
    for _ in range(5):
        t0 = time.perf_counter()
        r = httpx.get(f"{server.url}/api/v1/spaces/personal/list", params={"path": "many"}, headers=h)
        first.append((time.perf_counter() - t0) * 1000)
        assert len(r.json()["entries"]) == min(args.files, 1000)  # a page holds 1,000
    print(f"first page of {args.files} files: median {statistics.median(first):.0f} ms, max {max(first):.0f} ms")
    walk = _timed(lambda: httpx.post(f"{server.url}/api/v1/spaces/personal:admin/reconcile", headers=h,
                                     timeout=600).raise_for_status())  # fmt: skip
    rate = args.files / walk
    print(f"reconciliation walk of {args.files} files: {walk:.2f} s ({rate:,.0f} files/s; "
          f"1,000,000 files ~ {1e6 / rate:.0f} s, in the background every storage_reconcile_s)")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=2048)
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--chunk-mib", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--settle-s",
        type=float,
        default=10.0,
        help="pause before each figure: on a virtual machine whose host takes back the memory its guest leaves free "
        "(virtio-balloon free page reporting), the first write into such a page is 3-4 times slower, and a write "
        "that follows a file's deletion at once reuses the pages still held; after the pause every figure, the "
        "copy included, writes into memory in the same state (0 on a machine without it)",
    )
    args = ap.parse_args()
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} CPUs, load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}")  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-storage-") as d:
        tmp = Path(d)
        src = tmp / "big.bin"
        with src.open("wb") as fh:
            for _ in range(args.size_mib):
                fh.write(os.urandom(2**20))
        server = _server(tmp)
        try:
            h, token = _admin(server)
            httpx.get(f"{server.url}/api/v1/spaces/personal/list", headers=h).raise_for_status()  # its folder made
            _throughput(args, tmp, src, server, token)
            _listing(args, server, h)
        finally:
            server.stop()
            kill_job_processes(server.data_dir)
    print(f"load average at the end {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
