"""The container runtime against real rootful podman: what a job in a container can and cannot do, limits, typed
launch errors, distributed ranks, and re-attach after the server died. Skipped where podman or the base image is
not usable (``caldera images bootstrap`` makes the image)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from caldera.config import FakeGpu, Settings
from caldera.core.cluster import Allocation
from caldera.core.spec import JobSpec
from caldera.images.ready import base_tag
from caldera.runtime.base import Handle, LaunchError, LaunchRequest, Phase, RunAs
from caldera.runtime.container.runtime import ContainerRuntime
from tests.conftest import traversable
from tests.needs import podman_usable  # noqa: F401 - fixture

from .conftest import TERMINAL, wait_for, wait_terminal

pytestmark = pytest.mark.usefixtures("podman_usable")
REPO = Path(__file__).resolve().parents[2]
ALICE = RunAs("alice", 201_001, 201_001)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        data_dir=traversable(tmp_path) / "data",
        node_name="ctr-node",
        cancel_grace_s=2.0,
        fake_gpus=[FakeGpu(model="a100")] * 2,
    )


@pytest.fixture
def rt(settings: Settings) -> ContainerRuntime:
    return ContainerRuntime(settings)


@pytest.fixture
def launch(rt: ContainerRuntime, settings: Settings) -> Iterator[Callable[..., Handle]]:
    """``launch(run_as=ALICE, alloc=Allocation|None, **spec)``: as alice in her workspace; stopped at teardown."""
    started: list[Handle] = []

    def _launch(run_as: RunAs | None = ALICE, alloc: Allocation | None = None, **spec: Any) -> Handle:
        job_id = f"ct-{uuid.uuid4().hex[:10]}"
        spec.setdefault("name", job_id)
        home = settings.workspaces / (run_as.name if run_as else "alice")
        req = LaunchRequest(
            job_id,
            1,
            JobSpec.model_validate(spec),
            (alloc,) * spec.get("replicas", 1) if alloc else (),
            workdir=home / "jobs" / job_id,
            run_as=run_as,
            home=home,
        )
        h = rt.launch(req)
        started.append(h)
        return h

    yield _launch
    for h in started:
        if rt.observe(h).phase not in TERMINAL:
            rt.stop(h, 0)
            wait_terminal(rt, h)


def _run(rt: ContainerRuntime, h: Handle) -> tuple[Any, str]:
    obs = wait_terminal(rt, h, timeout=60)
    return obs, b"".join(rt.logs(h)).decode()


def test_a_job_runs_as_its_owner_with_no_capability_and_no_network(rt, launch) -> None:
    script = (
        "echo uid=$(id -u) gid=$(id -g) groups=$(id -G); grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/self/status; "
        "echo nets=$(ls /sys/class/net); echo home=$HOME pwd=$(pwd); touch mine; ls -n mine"
    )
    obs, out = _run(rt, launch(command=["sh", "-c", script]))
    assert (obs.phase, obs.exit_code) == (Phase.SUCCEEDED, 0), out
    assert "uid=201001 gid=201001 groups=201001" in out
    assert "CapEff:\t0000000000000000" in out and "CapBnd:\t0000000000000000" in out
    assert "NoNewPrivs:\t1" in out
    assert "nets=lo\n" in out  # network none: loopback only
    assert " 201001 201001 " in out  # what it writes in its workspace is its owner's


def test_a_job_sees_only_its_workspace_of_the_host(rt, launch, settings, tmp_path) -> None:
    data = settings.data_dir
    data.mkdir(parents=True, exist_ok=True)
    (data / "secrets.json").write_text("{}")
    (data / "caldera.db").write_text("db")
    bob = settings.workspaces / "bob"
    bob.mkdir(parents=True)
    (bob / "notes.txt").write_text("bob's")
    (tmp_path / "host-only.txt").write_text("host")
    probes = [data / "secrets.json", data / "caldera.db", settings.runs_dir, bob, tmp_path / "host-only.txt"]
    probes += [Path(sys.executable), REPO / "pyproject.toml"]  # nor the platform's Python and code
    script = "for p in " + " ".join(f"'{p}'" for p in probes) + '; do test -e "$p" && echo "SEES $p"; done; '
    script += f"ls {data}; ls {settings.workspaces}; echo done"
    obs, out = _run(rt, launch(command=["sh", "-c", script]))
    assert obs.phase is Phase.SUCCEEDED, out
    assert "SEES" not in out, out
    # of the data directory only the mount points exist: its own scratch and its owner's workspace
    assert out.split("done")[0].split() == ["scratch", "workspaces", "alice"], out


def test_cgroup_limits_come_from_the_allocation_and_memory_is_enforced(rt, launch) -> None:
    alloc = Allocation("ctr-node", (), 1.5, 64)
    show = (
        "cat /sys/fs/cgroup/pids.max /sys/fs/cgroup/pids/pids.max /sys/fs/cgroup/memory.max "
        "/sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/cpu.max /sys/fs/cgroup/cpu/cpu.cfs_quota_us "
        "2>/dev/null; true"
    )
    obs, out = _run(rt, launch(alloc=alloc, command=["sh", "-c", show]))
    assert obs.phase is Phase.SUCCEEDED, out
    values = out.split()
    assert "4096" in values and str(64 * 1024 * 1024) in values, out
    assert "150000" in values or "150000 100000" in out, out  # 1.5 CPUs of a 100 ms period
    hog = launch(alloc=alloc, command=["python3", "-c", "x = bytearray(256 * 1024 * 1024); print('survived')"])
    obs, out = _run(rt, hog)
    assert (obs.phase, obs.exit_code) == (Phase.FAILED, 137), (obs, out)
    assert obs.reason in ("OutOfMemory", "Killed") and "memory" in obs.message, obs
    assert "survived" not in out


def test_fake_gpus_are_handed_over_as_the_local_runtime_does(rt, launch) -> None:
    alloc = Allocation("ctr-node", (1,), 1.0, 256)
    obs, out = _run(rt, launch(alloc=alloc, command=["sh", "-c", "echo cvd=$CUDA_VISIBLE_DEVICES"]))
    assert obs.phase is Phase.SUCCEEDED and "cvd=1" in out, out
    (node,) = rt.nodes()
    assert [g.model for g in node.gpus] == ["a100", "a100"]


def test_distributed_ranks_reach_each_other_on_their_own_loopback(rt, launch) -> None:
    code = textwrap.dedent("""
        import os, socket, time
        rank, port = int(os.environ["RANK"]), int(os.environ["MASTER_PORT"])
        if rank == 0:
            s = socket.socket(); s.bind(("127.0.0.1", port)); s.listen(1)
            c, _ = s.accept(); print("rank 0 got", c.recv(100).decode(), "of", os.environ["WORLD_SIZE"])
        else:
            for _ in range(100):
                try:
                    c = socket.create_connection(("127.0.0.1", port)); break
                except OSError:
                    time.sleep(0.1)
            c.sendall(b"hello from 1"); print("rank 1 sent")
    """)
    h = launch(kind="distributed", replicas=2, command=["python3", "-c", code])
    obs = wait_terminal(rt, h, timeout=60)
    logs = [b"".join(rt.logs(h, rank=r)).decode() for r in (0, 1)]
    assert (obs.phase, obs.exit_code) == (Phase.SUCCEEDED, 0), (obs, logs)
    assert "rank 0 got hello from 1 of 2" in logs[0] and "rank 1 sent" in logs[1]


def test_a_preempted_job_reads_its_notice_and_exits_cleanly(rt, launch, settings) -> None:
    script = "trap 'cat \"$CALDERA_PREEMPT_NOTICE\"; exit 0' TERM; echo up; while :; do sleep 0.1; done"
    h = launch(command=["sh", "-c", script])
    wait_for(lambda: b"up" in b"".join(rt.logs(h)), timeout=30, what="the job to start")
    rt.stop(h, grace_s=20, notice="preempted: urgent job\n")
    obs, out = _run(rt, h)
    assert (obs.phase, obs.exit_code) == (Phase.SUCCEEDED, 0), out
    assert "preempted: urgent job" in out


def test_launch_errors_are_typed_and_leave_nothing(rt, launch, settings) -> None:
    before = len(rt.podman.containers("caldera.job"))
    with pytest.raises(LaunchError) as err:
        launch(image="caldera/none:missing", command=["true"])
    assert err.value.reason == "ImageNotFound" and "caldera/none:missing" in str(err.value)
    with pytest.raises(LaunchError) as err:
        launch(command=["/opt/not/there"])
    assert err.value.reason == "CommandNotFound"
    with pytest.raises(LaunchError) as err:
        launch(kind="jupyter", image=base_tag("bookworm"))  # the default image has JupyterLab; the bare base none
    assert err.value.reason == "JupyterNotInImage"
    assert len(rt.podman.containers("caldera.job")) == before
    assert list(settings.runs_dir.glob("*/1")) == []  # a failed launch is moved out of the way, never a live attempt


def test_a_value_only_the_launcher_carries_needs_a_shell_in_the_image(rt, launch, tmp_path) -> None:
    """A value with a line break is applied by the launcher, with the image's /bin/sh: an image without one
    fails the launch with a reason (a value the env file holds does not need it)."""
    (tmp_path / "root" / "etc").mkdir(parents=True)
    tar = tmp_path / "noshell.tar"
    subprocess.run(["tar", "-C", str(tmp_path / "root"), "-cf", str(tar), "."], check=True)
    tag = f"caldera/test-noshell:{uuid.uuid4().hex[:8]}"
    rt.podman.run("import", str(tar), tag)
    try:
        with pytest.raises(LaunchError) as err:
            launch(image=tag, command=["./tool"], env={"MULTI": "a\nb"})
        assert err.value.reason == "ShellNotInImage" and "/bin/sh" in str(err.value)
    finally:
        rt.podman.run("rmi", "--force", tag, check=False)


def test_jobs_survive_a_sigkilled_server_and_are_reattached(settings, tmp_path) -> None:
    """A real server process launches a job in a container and is SIGKILLed; a new runtime finds it again."""
    server = textwrap.dedent(f"""
        import json, sys
        from pathlib import Path
        from caldera.config import Settings
        from caldera.core.spec import JobSpec
        from caldera.runtime.base import LaunchRequest
        from caldera.runtime.container.runtime import ContainerRuntime
        rt = ContainerRuntime(Settings(data_dir=Path({str(settings.data_dir)!r})))
        spec = JobSpec(name="orphan", command=["sh", "-c", "echo started; sleep 3; exit 7"])
        h = rt.launch(LaunchRequest("orphan", 1, spec, (), Path({str(tmp_path / "work")!r})))
        print(json.dumps(h.data), flush=True)
        sys.stdin.read()
    """)
    proc = subprocess.Popen([sys.executable, "-c", server], cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        data = json.loads(proc.stdout.readline())
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        rt = ContainerRuntime(settings)
        assert rt.observe(Handle("orphan", 1, data)).phase is Phase.RUNNING
        assert ContainerRuntime(settings).observe(Handle("orphan", 1)).phase is Phase.RUNNING  # from meta.json
        obs = wait_terminal(rt, Handle("orphan", 1, data), timeout=60)
        assert (obs.phase, obs.exit_code) == (Phase.FAILED, 7)
        # its containers are gone now; how it ended and what it wrote are not
        assert rt.podman.containers("caldera.job=orphan") == []
        again = ContainerRuntime(settings)
        assert again.observe(Handle("orphan", 1)).exit_code == 7
        assert b"".join(again.logs(Handle("orphan", 1))) == b"started\n"
    finally:
        if proc.poll() is None:
            proc.kill()
        rt = ContainerRuntime(settings)
        rt.stop(Handle("orphan", 1), 0)


def test_a_container_removed_behind_the_runtimes_back_is_lost(rt, launch) -> None:
    h = launch(command=["sleep", "60"])
    rt.podman.run("rm", "--force", h.data["names"][0])
    obs = ContainerRuntime(rt.settings).observe(h)
    assert (obs.phase, obs.reason) == (Phase.LOST, "ContainerGone")


def test_a_job_submitted_through_the_api_runs_in_a_container_as_its_owner(tmp_path) -> None:
    from sqlalchemy import select

    from caldera.db.models import User
    from tests.conftest import api_on, make_settings
    from tests.test_runs import _log, _submit, _until

    settings = make_settings(tmp_path, f"sqlite:///{tmp_path / 'caldera.db'}", runtime="container")
    with api_on(settings, ContainerRuntime(settings)) as (api, admin):
        platform = api.client.app.state.platform
        carol = api.user(admin, "carol")
        script = "echo uid=$(id -u) home=$HOME; cat /proc/self/cgroup | grep -c libpod; ls /sys/class/net"
        jid = _submit(api, carol, name="inside", command=["sh", "-c", script], resources={"gpu": 1, "memory_mib": 512})
        job = _until(api, carol, jid, {"Succeeded", "Failed"})
        out = _log(api, carol, jid)
        assert job["state"] == "Succeeded", (job["events"], out)
        with platform.session() as db:
            own = db.scalar(select(User.os_uid).where(User.username == "carol"))
        assert own and f"uid={own} " in out, out  # carol's own uid, not root
        assert f"home={settings.workspaces / 'carol'}" in out
        assert out.split()[-1] == "lo"


def test_a_failing_rank_stops_the_others(rt, launch) -> None:
    script = 'if [ "$RANK" = 1 ]; then exit 3; fi; trap "exit 143" TERM; while :; do sleep 0.1; done'
    h = launch(kind="distributed", replicas=2, command=["sh", "-c", script])
    obs = wait_terminal(rt, h, timeout=60)
    assert (obs.phase, obs.exit_code) == (Phase.FAILED, 3), obs
    assert obs.message.startswith("rank 1 exited with code 3"), obs


def test_one_listing_serves_many_observations(rt, launch, monkeypatch) -> None:
    handles = [launch(command=["sleep", "30"]) for _ in range(3)]
    calls = []
    real = rt.podman.containers
    monkeypatch.setattr(rt.podman, "containers", lambda *labels: calls.append(labels) or real(*labels))
    assert all(rt.observe(h).phase is Phase.RUNNING for h in handles)
    assert len(calls) <= 1, calls


def test_environment_values_reach_the_job_through_root_only_files(rt, launch, settings) -> None:
    env = {"SECRET_TOKEN": "s3cret-value", "MULTI": "line one\nline two", "CONTAINERS_CONF": "a\nb"}
    h = launch(command=["sh", "-c", 'echo "$SECRET_TOKEN"; echo "$MULTI"; echo "$CONTAINERS_CONF"'], env=env)
    obs, out = _run(rt, h)
    assert obs.phase is Phase.SUCCEEDED and out == "s3cret-value\nline one\nline two\na\nb\n", out
    run_dir = Path(h.data["run_dir"])
    assert run_dir.stat().st_mode & 0o777 == 0o700
    assert (run_dir / "rank-0.env").stat().st_mode & 0o777 == 0o600
    assert "line one" not in (run_dir / "rank-0.env").read_text()  # the launcher's file holds it
    assert "MULTI " in (run_dir / "rank-0.env.d" / "values").read_text()


def test_the_sigkill_of_a_stop_comes_even_if_the_server_died_right_after(rt, launch, settings) -> None:
    h = launch(run_as=None, command=["sh", "-c", "trap '' TERM; echo up; while :; do sleep 0.1; done"])
    wait_for(lambda: b"up" in b"".join(rt.logs(h)), timeout=30, what="the job to start")
    stopper = textwrap.dedent(f"""
        import json, os, signal
        from pathlib import Path
        from caldera.config import Settings
        from caldera.runtime.base import Handle
        from caldera.runtime.container.runtime import ContainerRuntime
        rt = ContainerRuntime(Settings(data_dir=Path({str(settings.data_dir)!r})))
        rt.stop(Handle({h.job_id!r}, 1, json.loads({json.dumps(json.dumps(h.data))})), grace_s=2)
        os.kill(os.getpid(), signal.SIGKILL)  # the server dies with the stop under way
    """)
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-c", stopper], cwd=REPO, timeout=60)
    obs = wait_terminal(ContainerRuntime(settings), h, timeout=60)
    assert (obs.phase, obs.exit_code, obs.reason) == (Phase.FAILED, 137, "Stopped")
    assert 1.5 <= time.monotonic() - t0 < 30


def test_a_job_finds_commands_on_its_images_path(rt, launch, tmp_path) -> None:
    tool = tmp_path / "hello"
    tool.write_text("#!/bin/sh\necho hello from $(command -v hello)\n")
    tool.chmod(0o755)
    tag = f"caldera/test-path:{uuid.uuid4().hex[:8]}"
    run = lambda *a: subprocess.run(["buildah", *a], capture_output=True, text=True, check=True).stdout.strip()  # noqa: E731
    ctr = run("from", "--pull=never", rt.cs.image)
    try:
        run("copy", "--chmod", "0755", ctr, str(tool), "/opt/tools/bin/hello")
        run("config", "--env", "PATH=/opt/tools/bin:/usr/bin:/bin", ctr)
        run("commit", "--rm", "-q", ctr, tag)
        obs, out = _run(rt, launch(image=tag, command=["hello"]))
        assert obs.phase is Phase.SUCCEEDED and out == "hello from /opt/tools/bin/hello\n", (obs, out)
    finally:
        subprocess.run(["buildah", "rm", ctr], capture_output=True)
        rt.podman.run("rmi", "--force", tag, check=False)


def test_a_job_sees_neither_another_jobs_scratch_nor_its_processes(rt, launch, settings) -> None:
    other = launch(command=["sh", "-c", "echo up; exec sleep 60"])
    wait_for(lambda: b"up" in b"".join(rt.logs(other)), timeout=30, what="the other job to start")
    other_scratch = other.data["scratch"]
    script = (
        f"test -e '{other_scratch}' && echo SEES-SCRATCH; ls {settings.scratch_dir}; "
        "for p in /proc/[0-9]*; do cat $p/comm; done | sort | tr '\\n' ' '"
    )
    bob = RunAs("bob", 201_003, 201_003)
    obs, out = _run(rt, launch(run_as=bob, command=["sh", "-c", script]))
    assert obs.phase is Phase.SUCCEEDED, out
    assert "SEES-SCRATCH" not in out and "sleep" not in out, out  # its own pid namespace: catatonit, sh, cat...
    assert out.split()[0].endswith(".1") and other.job_id not in out.split()[0], out  # its own scratch only


def test_a_shareable_job_gets_the_mps_pipe_directory_read_only(rt, launch, settings, tmp_path, monkeypatch) -> None:
    """With an MPS control daemon (here a fake one: its pipe directory with a ``control`` FIFO), a shareable job
    sees the pipe directory at the same path, read-only, and CUDA_MPS_PIPE_DIRECTORY names it; other jobs do not."""
    pipe = tmp_path / "nvidia-mps"
    pipe.mkdir(mode=0o755)
    traversable(pipe)
    os.mkfifo(pipe / "control")
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(pipe))
    alloc = Allocation("ctr-node", (0,), 1.0, 256)
    script = (
        'echo dir=$CUDA_MPS_PIPE_DIRECTORY limit=$CUDA_MPS_PINNED_DEVICE_MEM_LIMIT; test -p "$CUDA_MPS_PIPE_DIRECTORY/'
        'control" && echo fifo; touch "$CUDA_MPS_PIPE_DIRECTORY/planted" 2>/dev/null || echo refused; '
        "while ! test -e go; do sleep 0.1; done"
    )
    spec = {"command": ["sh", "-c", script], "shareable": True, "resources": {"gpu": 1, "gpu_memory_mib": 4000}}
    h = launch(alloc=alloc, env={"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4000M"}, **spec)
    wait_for(lambda: b"refused" in b"".join(rt.logs(h)) or rt.observe(h).phase in TERMINAL, 30, what="the job to look")
    mounts = json.loads(rt.podman.run("container", "inspect", h.data["names"][0], "--format", "{{json .Mounts}}"))
    mps = [m for m in mounts if m["Destination"] == str(pipe)]
    assert [(m["Source"], m["RW"]) for m in mps] == [(str(pipe), False)], mounts
    (settings.workspaces / "alice" / "jobs" / h.job_id / "go").touch()  # looked at while it ran: it may end
    obs, out = _run(rt, h)
    assert obs.phase is Phase.SUCCEEDED, out
    assert f"dir={pipe} limit=0=4000M\nfifo\nrefused\n" == out, out
    assert not (pipe / "planted").exists()
    # an exclusive job on the same host gets neither the mount nor the variable
    look = f'echo "dir=$CUDA_MPS_PIPE_DIRECTORY"; test -e {pipe} && echo SEES; true'
    h = launch(alloc=alloc, command=["sh", "-c", look])
    obs, out = _run(rt, h)
    assert obs.phase is Phase.SUCCEEDED and out == "dir=\n", out
