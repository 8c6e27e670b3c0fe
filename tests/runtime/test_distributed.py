"""Distributed jobs: rank environment, gang failure, private network, a real torch.distributed all_reduce."""

from __future__ import annotations

import importlib.util
import os
import socket
import sys
import time

import pytest

from caldera.runtime.base import Phase
from caldera.runtime.local import netns, procs

from .conftest import wait_for, wait_terminal

needs_netns = pytest.mark.skipif(not netns.available(), reason="needs root, unshare, nsenter and ip")


def _log(rt, h, rank) -> str:
    return b"".join(rt.logs(h, rank=rank)).decode()


def test_every_rank_gets_its_place_in_the_world(launch, runtime) -> None:
    h = launch(
        kind="distributed",
        replicas=2,
        procs_per_replica=2,
        gpus=((0, 1), (2, 3)),
        command=[
            "sh",
            "-c",
            "echo $MASTER_ADDR $MASTER_PORT $WORLD_SIZE $RANK $LOCAL_RANK $NODE_RANK "
            "$LOCAL_WORLD_SIZE $CUDA_VISIBLE_DEVICES",
        ],
    )
    obs = wait_terminal(runtime, h)
    assert (obs.phase, obs.exit_code) == (Phase.SUCCEEDED, 0)
    assert h.data["world_size"] == 4 and len(h.data["ranks"]) == 4
    rows = [_log(runtime, h, r).split() for r in range(4)]
    ports = {row[1] for row in rows}
    assert len(ports) == 1 and 0 < int(ports.pop()) < 65536
    assert [row[:1] + row[2:] for row in rows] == [
        ["127.0.0.1", "4", "0", "0", "0", "2", "0,1"],
        ["127.0.0.1", "4", "1", "1", "0", "2", "0,1"],
        ["127.0.0.1", "4", "2", "0", "1", "2", "2,3"],
        ["127.0.0.1", "4", "3", "1", "1", "2", "2,3"],
    ]


def test_one_failing_rank_stops_the_others(launch, runtime) -> None:
    t0 = time.monotonic()
    h = launch(
        kind="distributed",
        replicas=3,
        command=["sh", "-c", 'if [ "$RANK" = 1 ]; then sleep 0.3; exit 9; fi; exec sleep 60'],
    )
    obs = wait_terminal(runtime, h, timeout=30)
    assert time.monotonic() - t0 < 25  # not the 60 s the healthy ranks would sleep
    assert (obs.phase, obs.exit_code, obs.reason) == (Phase.FAILED, 9, "ExitCode")
    assert "rank 1" in obs.message
    # the shims exit just after their records; nothing of the job stays behind
    wait_for(lambda: not procs.job_processes(set(), tag_prefix=f"{h.job_id}/1/"), timeout=10)


@needs_netns
def test_ranks_share_a_private_network(launch, runtime, tmp_path) -> None:
    port = _free_port()
    work = tmp_path / "work" / "ns"
    listen = (
        "import os, socket, time; s = socket.socket(); "
        "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
        f"s.bind(('0.0.0.0', {port})) if os.environ['RANK'] == '0' else None; "
        "s.listen() if os.environ['RANK'] == '0' else None; "
        "print(os.readlink('/proc/self/ns/net'), os.environ['GLOO_SOCKET_IFNAME'], flush=True); "
        "open(f'up{os.environ[\"RANK\"]}', 'w').close(); time.sleep(60)"
    )
    h = launch(job_id="ns", kind="distributed", replicas=2, command=[sys.executable, "-c", listen])
    assert h.data["netns"] is True
    wait_for(lambda: (work / "up0").exists() and (work / "up1").exists(), timeout=30)
    ns = {_log(runtime, h, r).split()[0] for r in range(2)}
    assert len(ns) == 1 and ns != {os.readlink("/proc/self/ns/net")}  # one namespace, not the host's
    assert _log(runtime, h, 0).split()[1] == "lo"  # gloo must not look for the host's NIC
    with pytest.raises(OSError):  # rank 0 listens on 0.0.0.0 ... in there
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    # no holder process outlives the launch: the ranks keep the namespace alive by themselves
    [netns_id] = ns
    members = [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc"))) if _netns_of(pid) == netns_id]
    assert members and set(members) <= set(procs.job_processes(set(), tag_prefix="ns/1/"))
    runtime.stop(h, 0)
    wait_terminal(runtime, h)


def test_isolation_can_be_switched_off(launch, settings, tmp_path) -> None:
    from caldera.runtime.local.runtime import LocalRuntime

    rt = LocalRuntime(settings.model_copy(update={"isolate_distributed_network": False}))
    h = launch(rt=rt, kind="distributed", replicas=2, command=["readlink", "/proc/self/ns/net"])
    assert wait_terminal(rt, h).phase is Phase.SUCCEEDED
    assert h.data["netns"] is False
    assert _log(rt, h, 1).strip() == os.readlink("/proc/self/ns/net")


ALL_REDUCE = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print(f"rank {dist.get_rank()}/{dist.get_world_size()} all_reduce {t.item():.1f}", flush=True)
dist.destroy_process_group()
"""


@pytest.mark.torch
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_torch_gloo_all_reduce(launch, runtime) -> None:
    h = launch(
        kind="distributed",
        replicas=1,
        procs_per_replica=2,
        command=[sys.executable, "-c", ALL_REDUCE],
        env={"OMP_NUM_THREADS": "1"},
    )
    obs = wait_terminal(runtime, h, timeout=120)
    logs = [_log(runtime, h, r) for r in range(2)]
    assert (obs.phase, obs.exit_code) == (Phase.SUCCEEDED, 0), logs
    assert "rank 0/2 all_reduce 3.0" in logs[0]
    assert "rank 1/2 all_reduce 3.0" in logs[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _netns_of(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None
