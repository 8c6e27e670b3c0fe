"""The contract every runtime keeps, run over each one: the local process runtime, the in-memory fake the API and
loop tests use, and the container runtime where podman and its base image are usable.

Jobs are described by ``SCRIPT_*`` variables (see tests/fake_runtime.py) and run SCRIPT, a shell script obeying
them, so the same test means the same on real processes, in containers and in the fake.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from caldera.config import FakeGpu, Settings
from caldera.core.spec import JobSpec
from caldera.runtime.base import Handle, LaunchError, LaunchRequest, Phase, Runtime
from tests import needs
from tests.fake_runtime import FakeRuntime

from .conftest import TERMINAL, wait_for

# sh runs a trap only once the foreground command ends, hence the loop of short sleeps
SCRIPT = (
    'printf "%s" "$SCRIPT_OUTPUT"; '
    'case "$SCRIPT_ON_TERM" in exit) trap "exit 0" TERM ;; ignore) trap "" TERM ;; esac; '
    'i=0; while [ "$i" -lt "${SCRIPT_TENTHS:-0}" ]; do sleep 0.1; i=$((i + 1)); done; '
    'exit "${SCRIPT_EXIT:-0}"'
)


def _local(settings: Settings) -> Runtime:
    from caldera.runtime.local.runtime import LocalRuntime

    return LocalRuntime(settings)


def _container(settings: Settings) -> Runtime:
    from caldera.runtime.container.runtime import ContainerRuntime

    return ContainerRuntime(settings)


FACTORIES: dict[str, Callable[[Settings], Runtime]] = {"local": _local, "fake": FakeRuntime, "container": _container}


@pytest.fixture(params=sorted(FACTORIES))
def make_runtime(request, tmp_path: Path) -> Callable[[], Runtime]:
    """Builds a runtime of one kind; every call is a new instance over the same host (a restarted server)."""
    if request.param == "container":
        needs.podman()
    settings = Settings(
        data_dir=tmp_path / "data",
        node_name="contract-node",
        fake_gpus=[FakeGpu(model="a100", memory_mib=40960)] * 2,
    )
    return lambda: FACTORIES[request.param](settings)


@pytest.fixture
def rt(make_runtime) -> Runtime:
    return make_runtime()


@pytest.fixture
def launch(make_runtime, tmp_path: Path) -> Iterator[Callable[..., Handle]]:
    """``launch(rt, output=, tenths=, exit=, on_term=, command=)``; whatever it started is stopped at teardown."""
    started: list[Handle] = []

    def _launch(rt: Runtime, command: list[str] | None = None, **script: Any) -> Handle:
        job_id = f"c-{uuid.uuid4().hex[:10]}"
        env = {f"SCRIPT_{k.upper()}": str(v) for k, v in script.items()}
        spec = JobSpec(name=job_id, command=command or ["sh", "-c", SCRIPT], env=env)
        req = LaunchRequest(job_id, 1, spec, (), workdir=tmp_path / "work" / job_id)
        h = rt.launch(req)
        started.append(h)
        return h

    yield _launch
    rt = make_runtime()
    for h in started:
        if rt.observe(h).phase not in TERMINAL:
            rt.stop(h, 0)
            wait_terminal(rt, h)


def wait_terminal(rt: Runtime, h: Handle, timeout: float = 60):
    def done():
        obs = rt.observe(h)
        return obs if obs.phase in TERMINAL else None

    return wait_for(done, timeout, what=f"{h.job_id} to end")


def test_a_job_runs_then_succeeds_and_its_log_reads_from_any_offset(rt, launch) -> None:
    h = launch(rt, output="hello world\n", tenths=30)
    assert rt.observe(h).phase in (Phase.STARTING, Phase.RUNNING)
    assert b"".join(rt.logs(h, follow=True)) == b"hello world\n"  # follows until the job ended
    obs = wait_terminal(rt, h)
    assert (obs.phase, obs.exit_code) == (Phase.SUCCEEDED, 0)
    assert b"".join(rt.logs(h)) == b"hello world\n"
    assert b"".join(rt.logs(h, offset=6)) == b"world\n"
    assert b"".join(rt.logs(h, rank=0, offset=100)) == b""
    with pytest.raises(ValueError):
        list(rt.logs(h, rank=1))


def test_a_failing_job_reports_its_exit_code(rt, launch) -> None:
    obs = wait_terminal(rt, launch(rt, exit=3))
    assert (obs.phase, obs.exit_code, obs.reason) == (Phase.FAILED, 3, "ExitCode")
    assert "3" in obs.message


def test_stop_lets_a_job_exit_cleanly_within_its_grace(rt, launch) -> None:
    h = launch(rt, on_term="exit", tenths=600)
    time.sleep(1.0)  # its trap is set
    t0 = time.monotonic()
    rt.stop(h, grace_s=30)
    assert time.monotonic() - t0 < 2.0  # returns at once
    obs = wait_terminal(rt, h)
    assert (obs.phase, obs.exit_code) == (Phase.SUCCEEDED, 0)
    assert time.monotonic() - t0 < 20  # nowhere near the grace


def test_stop_kills_a_job_ignoring_sigterm_after_the_grace(rt, launch) -> None:
    h = launch(rt, on_term="ignore", tenths=600)
    time.sleep(1.0)
    t0 = time.monotonic()
    rt.stop(h, grace_s=2.0)
    assert time.monotonic() - t0 < 2.0
    assert rt.observe(h).phase is Phase.RUNNING  # inside its grace
    obs = wait_terminal(rt, h)
    assert time.monotonic() - t0 >= 1.9
    assert (obs.phase, obs.exit_code, obs.reason) == (Phase.FAILED, 137, "Stopped")


def test_a_new_runtime_instance_reattaches(make_runtime, launch) -> None:
    first = make_runtime()
    h = launch(first, output="still here\n", tenths=40, exit=5)
    data = json.loads(json.dumps(h.data))  # what the server stored
    del first  # the server is gone
    second = make_runtime()
    handle = Handle(h.job_id, h.attempt, data)
    assert second.observe(handle).phase is Phase.RUNNING
    obs = wait_terminal(second, handle)
    assert (obs.phase, obs.exit_code) == (Phase.FAILED, 5)
    assert b"".join(make_runtime().logs(handle)) == b"still here\n"


def test_a_launch_that_cannot_happen_says_why_and_leaves_nothing(rt, launch, tmp_path) -> None:
    with pytest.raises(LaunchError) as err:
        launch(rt, command=["no-such-program-caldera"])
    assert err.value.reason == "CommandNotFound"
    assert "no-such-program-caldera" in str(err.value)
    assert isinstance(err.value, RuntimeError)  # callers that only know RuntimeError still catch it


def test_an_attempt_never_launched_is_lost(rt) -> None:
    assert rt.observe(Handle("never-launched", 1)).phase is Phase.LOST


def test_nodes_describe_this_host_and_its_gpus(rt) -> None:
    (node,) = rt.nodes()
    assert node.name == "contract-node"
    assert node.cpu > 0 and node.memory_mib > 0
    assert [(g.index, g.model) for g in node.gpus] == [(0, "a100"), (1, "a100")]
