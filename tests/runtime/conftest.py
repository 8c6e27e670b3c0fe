"""Fixtures for the local runtime: real processes, run dirs under tmp_path, everything killed afterwards."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from caldera.config import FakeGpu, Settings
from caldera.core.cluster import Allocation
from caldera.core.spec import JobSpec
from caldera.runtime.base import Handle, LaunchRequest, Observation, Phase
from caldera.runtime.local.runtime import LocalRuntime

TERMINAL = {Phase.SUCCEEDED, Phase.FAILED, Phase.LOST}


def wait_for(pred: Callable[[], Any], timeout: float = 30.0, *, interval: float = 0.05, what: str = "condition") -> Any:
    """Poll until ``pred()`` is truthy (generous timeouts: the test host has two busy cores)."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def wait_terminal(rt: LocalRuntime, handle: Handle, timeout: float = 30.0) -> Observation:
    def done() -> Observation | None:
        obs = rt.observe(handle)
        return obs if obs.phase in TERMINAL else None

    return wait_for(done, timeout, what=f"{handle.job_id} to end")


def namespace_pids(h: Handle, rank: int = 0) -> dict[int, int]:
    """Every process of the job's rank, {pid as the rank sees it: pid on the host} (a rank has a PID namespace of
    its own; without one, both are the same)."""
    init = json.loads((Path(h.data["run_dir"]) / f"rank-{rank}.pid").read_text())["init_pid"]
    ns = os.readlink(f"/proc/{init}/ns/pid")
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and os.readlink(entry / "ns" / "pid") == ns:
                nspid = next(line for line in (entry / "status").read_text().splitlines() if line.startswith("NSpid:"))
                found[int(nspid.split()[-1])] = int(entry.name)
        except OSError:
            continue
    return found


def host_pid(h: Handle, pid: int, rank: int = 0) -> int:
    """The host's pid of the process the job's rank knows as ``pid``."""
    found = namespace_pids(h, rank)
    assert pid in found, f"no process {pid} in the namespace of rank {rank} of {h.job_id}"
    return found[pid]


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        data_dir=tmp_path / "data",
        node_name="testnode",
        cancel_grace_s=5.0,
        fake_gpus=[FakeGpu(model="A100", memory_mib=40960), FakeGpu(model="a100", memory_mib=40960)],
    )


@pytest.fixture
def runtime(settings: Settings) -> LocalRuntime:
    return LocalRuntime(settings)


@pytest.fixture
def launch(runtime: LocalRuntime, tmp_path: Path) -> Iterator[Callable[..., Handle]]:
    """``launch(job_id=, gpus=, req_env=, base_url=, **spec fields)``; whatever it started is killed at teardown."""
    handles: list[Handle] = []
    counter = iter(range(1, 10_000))

    def _launch(
        job_id: str | None = None,
        attempt: int = 1,
        gpus: tuple[tuple[int, ...], ...] = ((),),
        req_env: dict[str, str] | None = None,
        base_url: str = "",
        rt: LocalRuntime | None = None,
        **spec: Any,
    ) -> Handle:
        job_id = job_id or f"job{next(counter)}-{uuid.uuid4().hex[:8]}"  # run tags must not collide across tests
        spec.setdefault("name", job_id)
        js = JobSpec.model_validate(spec)
        allocs = tuple(Allocation("testnode", g, 1.0, 256) for g in gpus)
        req = LaunchRequest(
            job_id=job_id,
            attempt=attempt,
            spec=js,
            allocations=allocs,
            workdir=tmp_path / "work" / job_id,
            env=req_env or {},
            base_url=base_url,
        )
        h = (rt or runtime).launch(req)
        handles.append(h)
        return h

    yield _launch
    for h in handles:
        rt = LocalRuntime(runtime.settings)
        if rt.observe(h).phase not in TERMINAL:
            rt.stop(h, 0)
            try:
                wait_terminal(rt, h, timeout=20)
            except AssertionError:
                pass
