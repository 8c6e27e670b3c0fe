"""Jobs really run on this host through the API, the scheduler loop and the local runtime."""

import textwrap

import pytest

from tests.conftest import wait_for


def _submit(api, headers, **spec):
    r = api.client.post("/api/v1/jobs", json=spec, headers=headers)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def _state(api, headers, jid):
    return api.client.get(f"/api/v1/jobs/{jid}", headers=headers).json()


def _until(api, headers, jid, states, timeout=60):
    loop = api.client.app.state.loop

    def check():
        loop.tick()
        j = _state(api, headers, jid)
        return j if j["state"] in states else None

    return wait_for(check, timeout, what=f"{jid} in {states}")


def _log(api, headers, jid, rank=None):
    q = f"?rank={rank}" if rank is not None else ""
    return api.client.get(f"/api/v1/jobs/{jid}/logs{q}", headers=headers).text


def test_exit_code_decides_success_or_failure(api, admin):
    ok = _submit(api, admin, name="ok", command=["sh", "-c", "echo out; echo err >&2"])
    bad = _submit(api, admin, name="bad", command=["sh", "-c", "exit 3"])
    assert _until(api, admin, ok, {"Succeeded", "Failed"})["state"] == "Succeeded"
    j = _until(api, admin, bad, {"Succeeded", "Failed"})
    assert j["state"] == "Failed" and j["exit_code"] == 3
    assert "out" in _log(api, admin, ok) and "err" in _log(api, admin, ok)
    reasons = [e["to"] for e in j["events"]]
    assert reasons == ["Pending", "Queued", "Starting", "Running", "Failed"] or reasons == [
        "Pending",
        "Queued",
        "Starting",
        "Failed",
    ]


def test_exclusive_gpus_never_shared(api, admin):
    cmd = ["sh", "-c", 'echo "gpus=$CUDA_VISIBLE_DEVICES"; sleep 2']
    ids = [_submit(api, admin, name=f"g{i}", command=cmd, resources={"gpu": 2}) for i in range(3)]
    loop = api.client.app.state.loop
    loop.tick()
    states = [_state(api, admin, j)["state"] for j in ids]
    assert states.count("Queued") == 1, states  # 4 GPUs: two 2-GPU jobs fit, the third waits
    for j in ids:
        _until(api, admin, j, {"Succeeded"})
    seen = [_log(api, admin, j).strip().split("=")[1] for j in ids]
    first_two = [set(s.split(",")) for s in seen[:2]]
    assert all(len(s) == 2 for s in first_two) and not (first_two[0] & first_two[1])


def test_cancel_running_sends_sigterm_to_the_group(api, admin, platform):
    script = "trap 'echo term > got-term; exit 0' TERM; sleep 60 & wait"
    jid = _submit(api, admin, name="c", command=["sh", "-c", script])
    marker = platform.settings.workspaces / "admin" / "jobs" / jid / "got-term"
    _until(api, admin, jid, {"Running"})
    assert api.client.post(f"/api/v1/jobs/{jid}/cancel", headers=admin).status_code == 200
    j = _until(api, admin, jid, {"Cancelled"})
    assert marker.read_text().strip() == "term"
    assert [e["reason"] for e in j["events"]][-2:] == ["CancelRequested", "CancelledByUser"]


@pytest.mark.torch
def test_distributed_gloo_all_reduce(api, admin, tmp_path):
    pytest.importorskip("torch")
    # given inline: a job has a /tmp of its own, so a file the test wrote under the host's /tmp is not there
    script = textwrap.dedent("""
        import os, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        t = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(t)
        env = {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "MASTER_ADDR")}
        print("sum", t.item(), env, flush=True)
        dist.destroy_process_group()
    """)
    jid = _submit(
        api,
        admin,
        name="ddp",
        kind="distributed",
        command=["python", "-c", script],
        replicas=2,
        procs_per_replica=1,
        resources={"gpu": 1, "cpu": 1},
    )
    j = _until(api, admin, jid, {"Succeeded", "Failed"}, timeout=120)
    assert j["state"] == "Succeeded", (_log(api, admin, jid, 0), _log(api, admin, jid, 1))
    assert len(j["allocations"]) == 2
    for rank in (0, 1):
        out = _log(api, admin, jid, rank)
        assert "sum 3.0" in out
        assert f"'RANK': '{rank}'" in out and "'WORLD_SIZE': '2'" in out and f"'NODE_RANK': '{rank}'" in out


def test_logs_after_the_job_ended_and_unknown_rank(api, admin):
    jid = _submit(api, admin, name="l", command=["sh", "-c", "for i in 1 2 3; do echo line$i; done"])
    _until(api, admin, jid, {"Succeeded"})
    assert _log(api, admin, jid).split() == ["line1", "line2", "line3"]
    assert api.client.get(f"/api/v1/jobs/{jid}/logs?rank=5", headers=admin).status_code == 400
