"""Shared fixtures: settings in a temp dir, a platform on SQLite or a real PostgreSQL, an API client, and a real
`caldera up` server process."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from caldera.config import FakeGpu, Settings
from caldera.ports import unused_port

# the suite is written against the process runtime; where podman is usable the default would be containers, which
# tests/runtime/test_contract.py and tests/runtime/test_container*.py choose explicitly
os.environ.setdefault("CALDERA_RUNTIME", "local")
POSTGRES_URL = os.environ.get("CALDERA_TEST_POSTGRES_URL")  # e.g. postgresql+psycopg://postgres@127.0.0.1:5433/postgres


def _fresh_postgres_db() -> str:
    from sqlalchemy import create_engine, text

    name = "caldera_test_" + secrets.token_hex(4)
    admin = create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return POSTGRES_URL.rsplit("/", 1)[0] + "/" + name


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'caldera.db'}"
    if not POSTGRES_URL:
        pytest.skip("CALDERA_TEST_POSTGRES_URL not set")
    return _fresh_postgres_db()


ROOT = os.geteuid() == 0
# as root (CI), jobs run as their owners' uids; elsewhere the tests accept what a non-root admin would have to
RUN_JOBS_AS = "owner" if ROOT else "server"


def traversable(path: Path) -> Path:
    """Let job uids pass through ``path`` and its parents (pytest makes its temporary directories 0700)."""
    if ROOT:
        for parent in [path, *path.parents]:
            mode = parent.stat().st_mode
            if not mode & 0o001:
                os.chmod(parent, (mode & 0o7777) | 0o001)
    return path


def make_settings(tmp_path: Path, db_url: str | None = None, gpus: int = 4, model: str = "a100", **kw) -> Settings:
    kw.setdefault("run_jobs_as", RUN_JOBS_AS)
    return Settings(
        data_dir=traversable(tmp_path) / "data",
        database_url=db_url,
        fake_gpus=[FakeGpu(model=model)] * gpus,
        node_name="node-0",
        node_cpu=16,
        node_memory_mib=65536,
        cancel_grace_s=2,
        preempt_grace_s=2,
        schedule_interval_s=0.2,
        **kw,
    )


@pytest.fixture
def settings(tmp_path, db_url) -> Settings:
    return make_settings(tmp_path, db_url)


@pytest.fixture
def platform(settings):
    from caldera.server.platform import Platform
    from caldera.server.tenancy import bootstrap

    p = Platform.create(settings)
    with p.session() as db:
        bootstrap(db, "admin-password")
        db.commit()
    yield p
    p.engine.dispose()


class Api:
    """A TestClient that logs in as someone."""

    def __init__(self, client: TestClient):
        self.client = client

    def login(self, username: str, password: str) -> dict[str, str]:
        r = self.client.post("/api/v1/auth/login", json={"username": username, "password": password})
        assert r.status_code == 200, r.text
        return {"Authorization": f"Bearer {r.json()['access_token']}"}

    def user(self, admin: dict, username: str, password: str = "password-123", **body) -> dict[str, str]:
        r = self.client.post("/api/v1/users", json={"username": username, "password": password, **body}, headers=admin)
        assert r.status_code == 201, r.text
        return self.login(username, password)


@pytest.fixture
def api(platform):
    """The app without its background loop: tests drive scheduling cycles with `app.state.loop.tick()`."""
    from caldera.server.app import create_app

    with TestClient(create_app(platform, run_loop=False)) as client:
        yield Api(client)


@contextmanager
def api_on(settings: Settings, runtime) -> Iterator[tuple[Api, dict[str, str]]]:
    """The app without its background loop on a new platform with the ``runtime`` a test made, and the admin's
    headers."""
    from caldera.server.app import create_app
    from caldera.server.platform import Platform
    from caldera.server.tenancy import bootstrap

    platform = Platform.create(settings, runtime=runtime)
    with platform.session() as db:
        bootstrap(db, "admin-password")
        db.commit()
    with TestClient(create_app(platform, run_loop=False)) as client:
        api = Api(client)
        yield api, api.login("admin", "admin-password")
    platform.engine.dispose()


@pytest.fixture
def admin(api) -> dict[str, str]:
    return api.login("admin", "admin-password")


def free_port() -> int:
    return unused_port()


class ServerProcess:
    """`caldera up` as users run it, in its own process, so tests can SIGKILL and restart it."""

    def __init__(self, data_dir: Path, port: int, env: dict[str, str], gpus: int = 2, gpu_model: str = "a100"):
        self.data_dir, self.port, self.env = data_dir, port, env
        self.gpus, self.gpu_model = gpus, gpu_model
        self.lab_port = int(env.setdefault("CALDERA_LAB_PORT", str(free_port())))
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None
        self.output = ""

    def lab_url(self, job_id: str) -> str:
        """The origin of a job's lab: a host of its own under lab.localhost, another site than the platform's."""
        return f"http://{job_id}.lab.localhost:{self.lab_port}"

    def start(self) -> ServerProcess:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "caldera.cli.main",
                "up",
                "--data-dir",
                str(self.data_dir),
                "--port",
                str(self.port),
                "--fake-gpus",
                str(self.gpus),
                "--fake-gpu-model",
                self.gpu_model,
            ],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if (
                    httpx.get(self.url + "/api/v1/health", timeout=1).status_code == 200
                    and httpx.get(f"http://127.0.0.1:{self.lab_port}/", timeout=1).status_code == 404  # no lab
                ):
                    return self
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError(f"caldera up exited: {self.proc.stdout.read()}")
            time.sleep(0.2)
        raise RuntimeError("caldera up did not answer in 60 s")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class LoopbackTransport(httpx.HTTPTransport):
    """``*.localhost`` on loopback, as browsers resolve it (this host's resolver does not): the request keeps its
    URL and Host header, so cookies and the lab's routing see the name."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        named = request.url
        if named.host.endswith(".localhost"):
            request.url = named.copy_with(host="127.0.0.1")
        try:
            return super().handle_request(request)
        finally:
            request.url = named


def lab_client(**kw) -> httpx.Client:
    """An HTTP client that reaches labs at their own hosts (``<job>.lab.localhost``)."""
    return httpx.Client(transport=LoopbackTransport(), **kw)


def server_env(tmp_path: Path, db_url: str) -> dict[str, str]:
    return {
        **os.environ,
        "CALDERA_INITIAL_ADMIN_PASSWORD": "admin-password",
        "CALDERA_DATABASE_URL": db_url,
        "CALDERA_SCHEDULE_INTERVAL_S": "0.3",
        "CALDERA_CANCEL_GRACE_S": "2",
        "CALDERA_NODE_NAME": "node-0",
        "CALDERA_CONFIG_DIR": str(tmp_path / "cli-config"),
        "COLUMNS": "200",
        "CALDERA_RUN_JOBS_AS": RUN_JOBS_AS,
        # its own registry port: 8650 may be held by anything, e.g. a registry another run left behind
        "CALDERA_REGISTRY_PORT": str(free_port()),
        "CALDERA_METRICS_PORT": str(free_port()),  # likewise the metrics agent's and Prometheus's
        "CALDERA_PROMETHEUS_PORT": str(free_port()),
    }


@pytest.fixture
def server(tmp_path, db_url):
    srv = ServerProcess(traversable(tmp_path) / "data", free_port(), server_env(tmp_path, db_url))
    srv.start()
    yield srv
    srv.stop()
    kill_job_processes(srv.data_dir)


def kill_job_processes(data_dir: Path) -> None:
    """Jobs outlive the server by design; a test must not leave them running."""
    import json

    for pid_file in (data_dir / "runs").rglob("*.pid"):
        try:
            os.killpg(json.loads(pid_file.read_text())["shim_pid"], signal.SIGKILL)
        except (ProcessLookupError, PermissionError, ValueError, KeyError):
            pass


def wait_for(fn, timeout: float = 60, *, interval: float = 0.2, what: str = "condition"):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}; last value {last!r}")


def pytest_sessionfinish(session, exitstatus) -> None:
    """Name the threads a test left running: one still inside a C library when the interpreter exits can abort
    the whole run after every test passed (scripts/test also runs pytest with -X faulthandler to show where)."""
    import threading

    left = [t for t in threading.enumerate() if t is not threading.main_thread() and t.is_alive()]
    if left:
        names = ", ".join(f"{t.name}{' (daemon)' if t.daemon else ''}" for t in left)
        print(f"\nthreads still running at the end of the session: {names}", file=sys.stderr)
