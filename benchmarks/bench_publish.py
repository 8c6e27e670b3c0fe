"""Publishing a folder as a catalogue version: how long the request takes to answer (it checks and answers 202,
copying) against how long the server's background copy takes to make the version ready, and a plain local copy of
the same folder.

    python benchmarks/bench_publish.py [--size-mib 512] [--files 64] [--runs 3]

Starts `caldera up` in a temporary directory (same disk as the local copy), then prints one line per figure. Exits 0.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_storage import _admin, _server  # noqa: E402
from caldera.client import Client  # noqa: E402


def _folder(at: Path, size_mib: int, files: int) -> None:
    """Files in ``at`` (made through the API: its owner's), owned as its owner's (a personal space's copy leaves
    out what its owner does not own)."""
    block, owner = os.urandom(2**20), at.stat()
    for i in range(files):
        path = at / f"part-{i:04d}.bin"
        with path.open("wb") as fh:
            for _ in range(size_mib // files):
                fh.write(block)
        os.chown(path, owner.st_uid, owner.st_gid)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=512)
    ap.add_argument("--files", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-publish-") as d:
        tmp = Path(d)
        server = _server(tmp)
        try:
            _, token = _admin(server)
            sdk = Client(server.url, token, timeout=600)
            home = server.data_dir / "workspaces" / "admin"
            sdk.mkdir("big")
            _folder(home / "big", args.size_mib, args.files)
            os.sync()
            answers, readies, locals_ = [], [], []
            for run in range(args.runs):
                t0 = time.perf_counter()
                sdk.publish("bench-set", f"v{run}", space="personal", path="big", wait=False)
                answers.append(time.perf_counter() - t0)
                ready = sdk.wait_published("dataset", f"bench-set@v{run}", poll_s=0.05)
                readies.append(time.perf_counter() - t0)
                assert ready["size_bytes"] == args.size_mib // args.files * args.files * 2**20, ready
                t0 = time.perf_counter()
                shutil.copytree(home / "big", tmp / f"copy-{run}")
                locals_.append(time.perf_counter() - t0)
            size = args.size_mib // args.files * args.files
            print(f"folder            {size} MiB in {args.files} files, {args.runs} runs (medians)")
            print(f"publish answered  {statistics.median(answers) * 1000:7.1f} ms (202, copying)")
            ready = statistics.median(readies)
            print(f"version ready     {ready:7.2f} s ({size / ready:.0f} MiB/s)")
            local = statistics.median(locals_)
            print(f"local copytree    {local:7.2f} s ({size / local:.0f} MiB/s)")
            print(f"load average      {os.getloadavg()[0]:.2f}")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
