"""The build queue: one build at a time (a build is heavy: it may download gigabytes of wheels), each buildah under
CPU and memory limits, its output in a log file read like a job's log. A build is recorded ready only once pushed;
any failure removes what it made and keeps the log. A server that stops ends the build it runs and drops the queue;
when it starts again it builds every form it had not finished, and marks the snapshots it interrupted failed (Lost):
their sessions are gone."""

from __future__ import annotations

import logging
import os
import queue
import re
import shutil
import signal
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
from caldera.images.host import Host
from caldera.images.limits import BuildCgroup, LimitsUnavailable
from caldera.images.ready import base_tag
from caldera.images.sandbox import BUILD_USER, ROOT_ENV, Sandbox, SandboxUnavailable
from caldera.runtime.container.settings import ContainerSettings
from caldera.runtime.local.owner import platform_dir

logger = logging.getLogger(__name__)

CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
_CAUSES = (  # what a failed build's log says, as the user should read it
    (re.compile(r"No matching distribution found for (\S+)"), "pip found no package {0}"),
    (re.compile(r"E: Unable to locate package (\S+)"), "apt found no package {0}"),
    (re.compile(r"(?:requested|pinning) (?:access to the )?resource is denied|unauthorized"), "the registry refused"),
    (re.compile(r"connection refused"), "the image registry is not reachable"),
    (re.compile(r"^(?:E|W): Failed to fetch (\S+)", re.M), "apt could not fetch {0} from its mirror"),
)


class BuildFailed(RuntimeError):
    pass


class BuildStopped(RuntimeError):
    """The server is stopping: the build is neither ready nor failed, and the next start builds it again."""


def log_path(p: Host, image_id: str) -> Path:
    return p.settings.data_dir / "builds" / f"{image_id}.log"


def _cause(log: Path, default: str) -> str:
    text = log.read_text(errors="replace")[-200_000:] if log.exists() else ""
    for pattern, message in _CAUSES:
        m = pattern.search(text)
        if m:
            return message.format(*m.groups())
    return default


class Builder:
    """Builds run rootless: buildah as the build user, on its own storage (sandbox.py), under a cgroup of root's
    making (limits.py); their images are pushed from there. Root's podman keeps the base images and the snapshots
    (snapshot.py). Every tool starts with a fixed environment, never the server's or a user's."""

    def __init__(self, p: Host):
        self.p = p
        cs = ContainerSettings()
        self.podman = cs.global_args()
        self.buildah = ["buildah", *self.podman[1:]]
        self.env = {**ROOT_ENV, **({"CONTAINERS_CONF": str(cs.conf)} if cs.conf else {})}
        self.sandbox = Sandbox(p.settings.data_dir)
        self.unavailable: str | None = None  # why builds cannot run rootless here: then none runs
        self._stopping = threading.Event()
        self._running: subprocess.Popen | None = None
        self._running_lock = threading.Lock()

    def prepare(self) -> None:
        try:
            self.sandbox.prepare()
            self.unavailable = None
        except (SandboxUnavailable, OSError) as exc:
            self.unavailable = str(exc)

    def run(
        self,
        argv: list[str],
        log: Path,
        timeout_s: float,
        *,
        rootless: str | None = None,
        cgroup: BuildCgroup | None = None,
    ) -> None:
        """``rootless``: what runs as the build user (``buildah bud``); else a root tool with its fixed env."""
        what = f"{rootless} (as {BUILD_USER})" if rootless else f"{argv[0]} {argv[len(self.podman)]}"
        with log.open("ab") as out:
            out.write(f"$ {what} ...\n".encode())
            out.flush()
            rc = self._wait(
                subprocess.Popen(
                    argv,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=self.sandbox.env() if rootless else self.env,
                    cwd=self.sandbox.home if rootless else "/",
                    preexec_fn=cgroup.join if cgroup else None,  # plain writes, before setpriv drops root
                    start_new_session=True,  # its own process group: stop() ends the tool and all it started
                ),
                timeout_s,
            )
        if rc != 0:
            raise BuildFailed(f"{what} exited {rc}")

    def _wait(self, proc: subprocess.Popen, timeout_s: float) -> int:
        with self._running_lock:
            self._running = proc
        try:
            if self._stopping.is_set():
                _end(proc)
            try:
                rc = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _end(proc)
                raise BuildFailed(f"timed out after {timeout_s:g} s") from None
        finally:
            with self._running_lock:
                self._running = None
        if self._stopping.is_set():
            raise BuildStopped("the server stopped during the build")
        return rc

    def stop(self) -> None:
        """Ends the tool that runs now (its whole process group); any later one ends as it starts."""
        self._stopping.set()
        with self._running_lock:
            if self._running is not None:
                _end(self._running)

    def _rootless(self, tool: str) -> list[str]:
        if self.unavailable is not None or self.sandbox.user is None:
            self.prepare()
        if self.unavailable is not None:
            raise BuildFailed(f"builds run only rootless, and cannot here: {self.unavailable}")
        return self.sandbox.argv(tool)

    def build(self, form: BuildForm, ref: str, log: Path) -> None:
        """On the form's base (the API resolved it to a reference from the catalogue) or its Python's."""
        base = form.base or self.base_for(form.python)
        self.build_file(render(form, base, ref), base, ref, log)

    def build_file(self, containerfile: str, base: str, ref: str, log: Path) -> None:
        """Any Containerfile, as the build user: what the form checks is not what keeps the host safe."""
        s = self.p.settings
        buildah = self._rootless("buildah")
        self.sandbox.fresh_config()
        if base.startswith(registry.host(s) + "/"):
            self._pull(base, log)
        else:
            self._hand_over(base, log)
        ctx = self.sandbox.context(log.stem, containerfile)
        cgroup = BuildCgroup(log.stem, s.image_build_memory_mib, s.image_build_cpus)
        argv = [
            *buildah,
            "bud",
            "--pull=never",
            "--layers",
            "--force-rm",  # a failed step leaves no working container behind
            "--isolation=rootless",  # runc in the build user's namespace, its network from slirp4netns
            "-v",
            f"{CA_BUNDLE}:/run/caldera-ca.crt:ro",
            "-f",
            str(ctx / "Containerfile"),
            "-t",
            ref,
            str(ctx),
        ]
        try:
            cgroup.create()
            self.run(argv, log, s.image_build_timeout_s, rootless="buildah bud", cgroup=cgroup)
        except LimitsUnavailable as exc:
            raise BuildFailed(str(exc)) from None
        finally:
            cgroup.remove()
            shutil.rmtree(ctx, ignore_errors=True)  # fd-based: a link planted in it is removed, not followed

    def _call(self, argv: list[str], *, rootless: bool) -> subprocess.CompletedProcess:
        """A short podman command whose output is read, as root or as the build user."""
        return subprocess.run(
            [*(self._rootless("podman") if rootless else self.podman), *argv],
            capture_output=True,
            text=True,
            timeout=120,
            env=self.sandbox.env() if rootless else self.env,
            cwd=self.sandbox.home if rootless else "/",
        )

    def _image_id(self, ref: str, *, rootless: bool) -> str | None:
        r = self._call(["image", "inspect", "--format", "{{.Id}}", ref], rootless=rootless)
        return r.stdout.strip() if r.returncode == 0 else None

    def _hand_over(self, base: str, log: Path) -> None:
        """The base image into the build user's storage, when it is not there or differs from root's."""
        want = self._image_id(base, rootless=False)
        if want is None:
            raise BuildFailed(f"the base image {base} is missing: caldera images bootstrap")
        if self._image_id(base, rootless=True) == want:
            return
        archive = self.sandbox.base_archive(want[:16])
        archive.unlink(missing_ok=True)
        save = [*self.podman, "save", "--format", "oci-archive", "-o", str(archive), base]
        try:
            try:
                self.run(save, log, 900)
            except BuildFailed as exc:
                if "exited" not in str(exc):
                    raise
                # once more: a save has failed (exit 125, seen once under a loaded CI) while other root podman
                # commands changed the storage; its error is in the log above
                archive.unlink(missing_ok=True)
                self.run(save, log, 900)
            os.chown(archive, 0, self.sandbox.user.gid)  # type: ignore[union-attr] - prepared by _rootless
            os.chmod(archive, 0o640)
            pull = [*self._rootless("buildah"), "pull", f"oci-archive:{archive}"]
            self.run(pull, log, 900, rootless="buildah pull")
        finally:
            archive.unlink(missing_ok=True)

    def _pull(self, base: str, log: Path) -> None:
        """A catalogue image as the base: the build user pulls it from the registry (the newest push of its tag)."""
        s = self.p.settings
        tls = f"--tls-verify={'false' if registry.insecure(s) else 'true'}"
        with self.sandbox.authfile(registry.auth_json(s)) as authfile:
            creds = [f"--authfile={authfile}"] if authfile else []
            pull = [*self._rootless("buildah"), "pull", *creds, tls, f"docker://{base}"]
            self.run(pull, log, 1800, rootless="buildah pull")

    def base_for(self, python: str) -> str:
        """The base image of a Python version: the one bootstrapped from its Debian release."""
        return base_tag(PYTHONS[python])

    def pythons(self) -> list[str]:
        """The Python versions whose base image is on this host: what the build form offers."""
        return [v for v in PYTHONS if self.has(self.base_for(v))]

    def has(self, ref: str) -> bool:
        try:
            return self._image_id(ref, rootless=False) is not None
        except (OSError, subprocess.TimeoutExpired):
            return False

    def size(self, ref: str, *, rootless: bool = False) -> int:
        return int(self._call(["image", "inspect", ref, "--format", "{{.Size}}"], rootless=rootless).stdout or 0)

    def push(self, ref: str, log: Path, *, rootless: bool = False) -> None:
        """From root's storage (a snapshot) or the build user's (a build, with a login file only it reads)."""
        s = self.p.settings
        tls = f"--tls-verify={'false' if registry.insecure(s) else 'true'}"
        if not rootless:
            authfile = registry.authfile(s)
            creds = [f"--authfile={authfile}"] if authfile else []
            self.run([*self.buildah, "push", *creds, tls, ref, f"docker://{ref}"], log, 1800)
            return
        buildah = self._rootless("buildah")
        self.sandbox.fresh_config()
        with self.sandbox.authfile(registry.auth_json(s)) as authfile:
            creds = [f"--authfile={authfile}"] if authfile else []
            self.run([*buildah, "push", *creds, tls, ref, f"docker://{ref}"], log, 1800, rootless="buildah push")

    def remove(self, ref: str) -> None:
        """From both storages: an image is a build's or a snapshot's."""
        self._call(["rmi", "--ignore", ref], rootless=False)
        try:
            self._call(["rmi", "--ignore", ref], rootless=True)
        except BuildFailed:
            pass  # no rootless storage here: no build made anything


class BuildQueue:
    def __init__(self, p: Host, builder: Builder | None = None):
        self.p = p
        self.builder = builder or Builder(p)
        self.builder.prepare()  # the build user and its storage, made once here (idempotent)
        self._q: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._resume()

    def _resume(self) -> None:
        """What a stopped server left building: a form builds again (it is all in the form); a snapshot is Lost."""
        with self.p.session() as db:
            again = []
            for img in db.scalars(select(Image).where(Image.state == "building")):
                if img.source == "form":
                    again.append(img.id)
                else:
                    img.state, img.finished_at = "failed", time.time()
                    img.message = "Lost: the server restarted during it"
            db.commit()
        for image_id in again:
            _last_line(log_path(self.p, image_id), "the server restarted: this build starts again")
            self.submit(image_id)

    def submit(self, image_id: str, work: Callable[[str], None] | None = None) -> None:
        log = log_path(self.p, image_id)  # there from the start: a follower of a queued build waits on it
        platform_dir(log.parent, 0o700)  # a build's log is its owner's: jobs of other users pass the data dir
        log.touch()
        self._put(lambda: self._run(image_id, work or self._build))

    def discard(self, ref: str) -> None:
        """An image's copies in this host's storages go after the work queued before: podman's ``rmi`` waits on its
        storage lock, seconds while a build runs, which a deleting request should not; a build of the same name
        submitted later runs after it."""
        self._put(lambda: self.builder.remove(ref))

    def _put(self, item: Callable[[], None]) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._worker, name="image-builds", daemon=True)
                self._thread.start()
        self._q.put(item)

    def stop(self) -> None:
        """Drops the queued work and ends the build that runs: a stopped server leaves no build running behind it
        (a build may take an hour and gigabytes); forms still building start again with the server (_resume)."""
        while True:
            try:
                self._q.get_nowait()
            except queue.Empty:
                break
        self.builder.stop()
        if self._thread is not None:
            self._q.put(None)
            self._thread.join(timeout=30)

    def _worker(self) -> None:
        while (item := self._q.get()) is not None:
            try:
                item()
            except Exception:  # noqa: BLE001 - a removal that failed leaves a local copy; the worker goes on
                logger.exception("image housekeeping failed")

    def _run(self, image_id: str, work: Callable[[str], None]) -> None:
        try:
            work(image_id)
        except BuildStopped:
            _last_line(log_path(self.p, image_id), "stopped: the server stopped during it")
        except BuildFailed as exc:
            self._fail(image_id, _cause(log_path(self.p, image_id), str(exc)))
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
        self.finish(image_id, ref, log, rootless=True)

    def finish(self, image_id: str, ref: str, log: Path, *, rootless: bool = False) -> None:
        """Quota, push, record: the image is ready only when the registry holds it."""
        size = self.builder.size(ref, rootless=rootless)
        with self.p.session() as db:
            img = db.get(Image, image_id)
            owner = db.get(User, img.owner_id)
            catalogue.check_quota(db, self.p.settings, owner, size)  # Forbidden: its message is the failure
        registry.require_up(self.p.settings)
        self.builder.push(ref, log, rootless=rootless)
        with self.p.session() as db:
            img = db.get(Image, image_id)
            _last_line(log, f"ready: {ref} ({size / (1 << 20):.1f} MiB)")
            img.state, img.size_bytes, img.finished_at = "ready", size, time.time()
            img.message = f"pushed {ref}"
            db.commit()


def _end(proc: subprocess.Popen, grace_s: float = 5) -> None:
    """SIGTERM to the tool's process group (buildah removes its working container), then SIGKILL to whatever of the
    group is left after the grace."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _last_line(log: Path, line: str) -> None:
    """Written before the state changes: a reader that sees the build ended then finds the whole log."""
    with log.open("a") as out:
        out.write(f"\n{line}\n")
