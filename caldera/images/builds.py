"""The build queue: one build at a time (a build is heavy: it may download gigabytes of wheels), each buildah under
CPU and memory limits, its output in a log file read like a job's log. A build is recorded ready only once pushed;
any failure removes what it made and keeps the log. A server restart marks builds it interrupted failed (Lost)."""

from __future__ import annotations

import queue
import re
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import select

from caldera.db.models import Image, User
from caldera.images import catalogue, registry
from caldera.images.containerfile import render
from caldera.images.form import PYTHONS, BuildForm
from caldera.runtime.container.settings import ContainerSettings
from caldera.runtime.local.owner import platform_dir
from caldera.server.platform import Platform

CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
_CAUSES = (  # what a failed build's log says, as the user should read it
    (re.compile(r"No matching distribution found for (\S+)"), "pip found no package {0}"),
    (re.compile(r"E: Unable to locate package (\S+)"), "apt found no package {0}"),
    (re.compile(r"(?:requested|pinning) (?:access to the )?resource is denied|unauthorized"), "the registry refused"),
    (re.compile(r"connection refused"), "the image registry is not reachable"),
)


class BuildFailed(RuntimeError):
    pass


def log_path(p: Platform, image_id: str) -> Path:
    return p.settings.data_dir / "builds" / f"{image_id}.log"


def _cause(log: Path, default: str) -> str:
    text = log.read_text(errors="replace")[-200_000:] if log.exists() else ""
    for pattern, message in _CAUSES:
        m = pattern.search(text)
        if m:
            return message.format(*m.groups())
    return default


class Builder:
    """The tools: buildah for builds and pushes, podman for sizes and removal (same storage)."""

    def __init__(self, p: Platform):
        self.p = p
        cs = ContainerSettings()
        self.base = cs.image
        self.podman = cs.global_args()
        self.buildah = ["buildah", *self.podman[1:]]

    def run(self, argv: list[str], log: Path, timeout_s: float) -> None:
        with log.open("ab") as out:
            out.write(f"$ {' '.join(argv[:3])} ...\n".encode())
            out.flush()
            try:
                rc = subprocess.run(
                    argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=timeout_s
                ).returncode
            except subprocess.TimeoutExpired:
                raise BuildFailed(f"timed out after {timeout_s:g} s") from None
        if rc != 0:
            raise BuildFailed(f"{argv[0]} {argv[len(self.podman) if argv[0] == 'buildah' else 1]} exited {rc}")

    def build(self, form: BuildForm, ref: str, log: Path) -> None:
        s = self.p.settings
        ctx = log.with_suffix(".context")
        ctx.mkdir(parents=True, exist_ok=True)
        (ctx / "Containerfile").write_text(render(form, self.base_for(form.python), ref))
        period = 100_000
        argv = [
            *self.buildah,
            "bud",
            "--pull=never",
            "--layers",
            "--force-rm",  # a failed step leaves no working container behind
            "--isolation=oci",  # runc applies the cgroup limits below; chroot isolation would ignore them
            f"--memory={s.image_build_memory_mib}m",
            f"--cpu-period={period}",
            f"--cpu-quota={int(period * s.image_build_cpus)}",
            "-v",
            f"{CA_BUNDLE}:/run/caldera-ca.crt:ro",
            "-f",
            str(ctx / "Containerfile"),
            "-t",
            ref,
            str(ctx),
        ]
        self.run(argv, log, s.image_build_timeout_s)

    def base_for(self, python: str) -> str:
        """The base image of a Python version: its Debian release's tag of the default image's name."""
        return f"{self.base.rsplit(':', 1)[0]}:{PYTHONS[python]}"

    def pythons(self) -> list[str]:
        """The Python versions whose base image is on this host: what the build form offers."""
        return [v for v in PYTHONS if self.has(self.base_for(v))]

    def has(self, ref: str) -> bool:
        try:
            argv = [*self.podman, "image", "exists", ref]
            return subprocess.run(argv, capture_output=True, timeout=60).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    def size(self, ref: str) -> int:
        out = subprocess.run(
            [*self.podman, "image", "inspect", ref, "--format", "{{.Size}}"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        return int(out.stdout.strip() or 0)

    def push(self, ref: str, log: Path) -> None:
        tls = "false" if registry.insecure(self.p.settings) else "true"
        authfile = registry.authfile(self.p.settings)
        creds = [f"--authfile={authfile}"] if authfile else []
        self.run([*self.buildah, "push", *creds, f"--tls-verify={tls}", ref, f"docker://{ref}"], log, 1800)

    def remove(self, ref: str) -> None:
        subprocess.run([*self.podman, "rmi", "--ignore", ref], capture_output=True, timeout=120)


class BuildQueue:
    def __init__(self, p: Platform, builder: Builder | None = None):
        self.p = p
        self.builder = builder or Builder(p)
        self._q: queue.Queue[tuple[str, Callable[[str], None]] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._mark_lost()

    def _mark_lost(self) -> None:
        with self.p.session() as db:
            for img in db.scalars(select(Image).where(Image.state == "building")):
                img.state, img.message, img.finished_at = "failed", "Lost: the server restarted during it", time.time()
            db.commit()

    def submit(self, image_id: str, work: Callable[[str], None] | None = None) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._worker, name="image-builds", daemon=True)
                self._thread.start()
        log = log_path(self.p, image_id)  # there from the start: a follower of a queued build waits on it
        platform_dir(log.parent, 0o700)  # a build's log is its owner's: jobs of other users pass the data dir
        log.touch()
        self._q.put((image_id, work or self._build))

    def stop(self) -> None:
        if self._thread is not None:
            self._q.put(None)
            self._thread.join(timeout=5)

    def _worker(self) -> None:
        while (item := self._q.get()) is not None:
            image_id, work = item
            log = log_path(self.p, image_id)
            try:
                work(image_id)
            except BuildFailed as exc:
                self._fail(image_id, _cause(log, str(exc)))
            except Exception as exc:  # noqa: BLE001 - whatever broke, the build fails with its log kept
                self._fail(image_id, getattr(exc, "message", None) or str(exc))

    def _fail(self, image_id: str, message: str) -> None:
        with self.p.session() as db:
            img = db.get(Image, image_id)
            if img is None:
                return
            self.builder.remove(catalogue.reference(self.p.settings, img))
            _last_line(log_path(self.p, image_id), f"build failed: {message}")
            img.state, img.message, img.finished_at, img.size_bytes = "failed", message[:2000], time.time(), 0
            db.commit()

    def _build(self, image_id: str) -> None:
        s, log = self.p.settings, log_path(self.p, image_id)
        with self.p.session() as db:
            img = db.get(Image, image_id)
            form, ref = BuildForm.model_validate(img.form), catalogue.reference(s, img)
        self.builder.build(form, ref, log)
        self.finish(image_id, ref, log)

    def finish(self, image_id: str, ref: str, log: Path) -> None:
        """Quota, push, record: the image is ready only when the registry holds it."""
        size = self.builder.size(ref)
        with self.p.session() as db:
            img = db.get(Image, image_id)
            owner = db.get(User, img.owner_id)
            catalogue.check_quota(db, self.p.settings, owner, size)  # Forbidden: its message is the failure
        registry.require_up(self.p.settings)
        self.builder.push(ref, log)
        with self.p.session() as db:
            img = db.get(Image, image_id)
            _last_line(log, f"ready: {ref} ({size / (1 << 20):.1f} MiB)")
            img.state, img.size_bytes, img.finished_at = "ready", size, time.time()
            img.message = f"pushed {ref}"
            db.commit()


def _last_line(log: Path, line: str) -> None:
    """Written before the state changes: a reader that sees the build ended then finds the whole log."""
    with log.open("a") as out:
        out.write(f"\n{line}\n")
