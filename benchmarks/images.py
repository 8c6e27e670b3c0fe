"""Image build and snapshot figures: a typical form (python 3.11 + numpy + jupyterlab) built, pushed and recorded
through the API, then a Jupyter session of it saved as an image (time to ready and size).

    python benchmarks/images.py [--pip numpy --pip jupyterlab]

Runs a whole platform in this process (container runtime, its scheduler loop) with its own docker-registry on a
free loopback port, in a throw-away data directory. Needs root, podman, buildah, docker-registry and the base image.
A build's first run on a machine downloads its wheels; a rebuild of the same form hits buildah's layer cache, so
both are timed. What it made is deleted at the end."""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastapi.testclient import TestClient  # noqa: E402

from caldera.config import Settings  # noqa: E402
from caldera.images import registry  # noqa: E402
from caldera.server.app import create_app  # noqa: E402
from caldera.server.platform import Platform  # noqa: E402
from caldera.server.tenancy import bootstrap  # noqa: E402


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _until(fn, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if got := fn():
            return got
        time.sleep(0.5)
    raise SystemExit(f"timed out waiting for {what}")


def _ready(c: TestClient, h: dict, r) -> tuple[dict, float]:
    if r.status_code != 202:
        raise SystemExit(f"refused: {r.text}")
    t0, iid = time.monotonic(), r.json()["id"]
    img = _until(
        lambda: (i := c.get(f"/api/v1/images/{iid}", headers=h).json())["state"] != "building" and i, 3600, "image"
    )
    if img["state"] != "ready":
        raise SystemExit(f"{iid} failed: {img['message']}")
    return img, time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pip", action="append", default=None)
    args = ap.parse_args()
    form = {"name": "bench", "python": "3.11", "jupyter": True, "pip": args.pip or ["numpy"]}
    tmp = Path(tempfile.mkdtemp(prefix="caldera-bench-images-"))
    tmp.chmod(0o755)
    s = Settings(data_dir=tmp / "data", registry_port=_port(), runtime="container", node_name="bench")
    reg = registry.start_local(s)
    p = Platform.create(s)
    with p.session() as db:
        bootstrap(db, "admin-password")
        db.commit()
    made = []
    try:
        with TestClient(create_app(p)) as c:
            tok = c.post("/api/v1/auth/login", json={"username": "admin", "password": "admin-password"}).json()
            h = {"Authorization": f"Bearer {tok['access_token']}"}
            img, build_s = _ready(c, h, c.post("/api/v1/images", json={**form, "tag": "1"}, headers=h))
            made.append(img)
            again, rebuild_s = _ready(c, h, c.post("/api/v1/images", json={**form, "tag": "2"}, headers=h))
            made.append(again)
            job = c.post("/api/v1/jobs", json={"name": "lab", "kind": "jupyter", "image": img["reference"]}, headers=h)
            jid = job.json()["id"]
            _until(lambda: c.get(f"/api/v1/jobs/{jid}", headers=h).json()["state"] == "Running", 300, "the session")
            body = {"job_id": jid, "name": "bench", "tag": "snap"}
            snap, snap_s = _ready(c, h, c.post("/api/v1/images/snapshots", json=body, headers=h))
            made.append(snap)
            c.post(f"/api/v1/jobs/{jid}/cancel", headers=h)
            _until(lambda: c.get(f"/api/v1/jobs/{jid}", headers=h).json()["state"] == "Cancelled", 120, "cancel")
            mib = 1 << 20
            print(f"form: {form}")
            print(f"build (first on this machine) {build_s:.0f} s, image {img['size_bytes'] / mib:.0f} MiB")
            print(f"rebuild of the same form (layer cache) {rebuild_s:.1f} s")
            print(f"snapshot of a running session {snap_s:.1f} s, image {snap['size_bytes'] / mib:.0f} MiB")
            for i in made:
                c.delete(f"/api/v1/images/{i['id']}", headers=h)
    finally:
        if reg is not None:
            reg.terminate()


if __name__ == "__main__":
    main()
