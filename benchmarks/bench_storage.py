"""Storage spaces: upload and download throughput of one large file through the API (resumable chunks, the SDK)
and through WebDAV, against a plain local copy of the same file; the first page of a folder of many files; and the
reconciliation walk that keeps usage right without a walk per request.

    python benchmarks/bench_storage.py [--size-mib 2048] [--files 100000] [--chunk-mib 64]

Starts `caldera up` in a temporary directory (same disk as the copy), then prints one line per figure. Exits 0.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from caldera.client import Client  # noqa: E402
from tests.conftest import ServerProcess, free_port, kill_job_processes, traversable  # noqa: E402


def _server(tmp: Path) -> ServerProcess:
    env = {
        **os.environ,
        "CALDERA_INITIAL_ADMIN_PASSWORD": "admin-password",
        "CALDERA_RUN_JOBS_AS": "owner" if os.geteuid() == 0 else "server",
        "CALDERA_DATABASE_URL": f"sqlite:///{tmp / 'caldera.db'}",
        "CALDERA_NODE_NAME": "node-0",
        "CALDERA_METRICS_PORT": str(free_port()),
        "CALDERA_PROMETHEUS_PORT": str(free_port()),
        "CALDERA_REGISTRY_PORT": str(free_port()),
        "CALDERA_STORAGE_QUOTA_BYTES": str(2**40),
        "CALDERA_STORAGE_QUOTA_FILES": str(10**7),
    }
    return ServerProcess(traversable(tmp) / "data", free_port(), env).start()


def _rate(size: int, seconds: float) -> str:
    return f"{size / seconds / 2**20:7.1f} MiB/s ({seconds:.2f} s)"


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=2048)
    ap.add_argument("--files", type=int, default=100_000)
    ap.add_argument("--chunk-mib", type=int, default=64)
    args = ap.parse_args()
    size = args.size_mib * 2**20
    with tempfile.TemporaryDirectory(prefix="bench-storage-") as d:
        tmp = Path(d)
        src = tmp / "big.bin"
        with src.open("wb") as fh:
            for _ in range(args.size_mib):
                fh.write(os.urandom(2**20))
        os.sync()
        server = _server(tmp)
        try:
            login = httpx.post(
                f"{server.url}/api/v1/auth/login", json={"username": "admin", "password": "admin-password"}
            )
            h = {"Authorization": f"Bearer {login.json()['access_token']}"}
            token = httpx.post(f"{server.url}/api/v1/tokens", json={"name": "bench"}, headers=h).json()["token"]
            sdk = Client(server.url, token, timeout=600)
            home = server.data_dir / "workspaces" / "admin"

            copy = _timed(lambda: shutil.copyfile(src, tmp / "copy.bin"))
            print(f"local copy        {_rate(size, copy)}")
            up = _timed(lambda: sdk.upload(src, "api.bin", chunk_bytes=args.chunk_mib * 2**20))
            print(f"API upload        {_rate(size, up)}  = {copy / up:.0%} of the copy's speed")
            down = _timed(lambda: sdk.download("api.bin", tmp / "api-back.bin"))
            print(f"API download      {_rate(size, down)}  = {copy / down:.0%} of the copy's speed")
            auth = ("admin", token)

            def dav_put() -> None:
                with src.open("rb") as fh:
                    r = httpx.put(f"{server.url}/dav/personal/dav.bin", content=fh, auth=auth, timeout=600)
                    r.raise_for_status()

            def dav_get() -> None:
                url = f"{server.url}/dav/personal:admin/dav.bin"
                with httpx.stream("GET", url, auth=auth, timeout=600) as r, (tmp / "dav-back.bin").open("wb") as out:
                    for block in r.iter_bytes(2**20):
                        out.write(block)

            put = _timed(dav_put)
            print(f"WebDAV upload     {_rate(size, put)}  = {copy / put:.0%} of the copy's speed")
            get = _timed(dav_get)
            print(f"WebDAV download   {_rate(size, get)}  = {copy / get:.0%} of the copy's speed")
            for name in ("copy.bin", "api-back.bin", "dav-back.bin"):
                (tmp / name).unlink()
            for name in ("api.bin", "dav.bin"):
                (home / name).unlink()

            many = home / "many"
            many.mkdir()
            for i in range(args.files):
                (many / f"f{i:07d}").touch()
            first = []
            for _ in range(5):
                t0 = time.perf_counter()
                r = httpx.get(f"{server.url}/api/v1/spaces/personal/list", params={"path": "many"}, headers=h)
                first.append((time.perf_counter() - t0) * 1000)
                assert len(r.json()["entries"]) == 1000
            print(
                f"first page of {args.files} files: median {statistics.median(first):.0f} ms, max {max(first):.0f} ms"
            )
            walk = _timed(lambda: httpx.post(f"{server.url}/api/v1/spaces/personal:admin/reconcile", headers=h,
                                             timeout=600).raise_for_status())  # fmt: skip
            rate = args.files / walk
            print(f"reconciliation walk of {args.files} files: {walk:.2f} s ({rate:,.0f} files/s; "
                  f"1,000,000 files ~ {1e6 / rate:.0f} s, in the background every storage_reconcile_s)")  # fmt: skip
        finally:
            server.stop()
            kill_job_processes(server.data_dir)


if __name__ == "__main__":
    main()
