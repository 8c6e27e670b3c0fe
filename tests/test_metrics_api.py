"""The metrics views through the API, end to end: two users' real jobs (process runtime) load fake GPUs, the node
agent samples them, Debian's real Prometheus scrapes it, and the API reads the views back with PromQL. Each user
reads only their own jobs' series and the cluster totals; the node view and the CSV are the admins'. A Prometheus
that hangs or is not there gives every view a reason within its time box."""

from __future__ import annotations

import csv
import io
import re
import shutil
import time

import pytest

from caldera.metrics.sources.fake.source import FakeSource
from caldera.server.metrics import platform_agent
from tests.conftest import api_on, free_port, make_settings, wait_for
from tests.portal import browser_for
from tests.test_runs import _submit, _until

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None, reason="Debian's prometheus is not installed")


def _load(utilisation: int, memory_mib: int) -> list[str]:
    body = f'{{"utilisation": {utilisation}, "memory_mib": {memory_mib}}}'
    return ["sh", "-c", f"echo '{body}' > gpu_load.json; sleep 120"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """alice's job computes on one GPU (70 %), bob's holds one idle (2 %); both sampled every second."""
    from caldera.metrics import prometheus

    tmp = tmp_path_factory.mktemp("metrics-api")
    s = make_settings(
        tmp,
        runtime="local",
        metrics_interval_s=1,
        metrics_rule_interval_s=1,
        metrics_port=free_port(),
        prometheus_port=free_port(),
    )
    with api_on(s, None) as (api, admin):
        alice, bob = api.user(admin, "alice"), api.user(admin, "bob")
        busy = _submit(api, alice, name="busy", command=_load(70, 3000), resources={"gpu": 1})
        idle = _submit(api, bob, name="idle", command=_load(2, 500), resources={"gpu": 1})
        for headers, job in ((alice, busy), (bob, idle)):
            _until(api, headers, job, {"Running"})
        platform = api.client.app.state.platform
        agent = platform_agent(platform, "node-0", FakeSource(s))
        server = agent.serve(s.metrics_port)
        agent.start(s.metrics_interval_s)
        proc = prometheus.start_local(s, [f"127.0.0.1:{s.metrics_port}"])
        try:
            prom = prometheus.client(s)
            # both jobs' loads written and scraped a few times
            wait_for(
                lambda: sorted(u.mean_percent for u in prom.job_gpu_utilisation(60) if u.samples >= 3) == [2.0, 70.0],
                60,
                what="both jobs' GPUs scraped",
            )
            yield api, admin, alice, bob, busy, idle
        finally:
            for headers, job in ((alice, busy), (bob, idle)):
                api.client.post(f"/api/v1/jobs/{job}/cancel", headers=headers)
            proc.terminate()
            proc.wait(10)
            server.shutdown()
            agent.stop()


def _get(api, headers, path: str, status: int = 200) -> dict:
    r = api.client.get(path, headers=headers)
    assert r.status_code == status, r.text
    return r.json()


def _last(points: list) -> float:
    return [v for _, v in points if v is not None][-1]


def test_a_job_view_has_its_gpu_cpu_memory_series_and_events(cluster):
    api, admin, alice, bob, busy, _ = cluster
    view = _get(api, alice, f"/api/v1/metrics/jobs/{busy}")
    assert view["available"] and view["job"] == busy
    (gpu,) = view["gpu_utilisation"]
    assert gpu["replica"] == 0 and gpu["node"] == "node-0" and _last(gpu["points"]) == 70.0
    (mem,) = view["gpu_memory_bytes"]
    assert _last(mem["points"]) == 3000 * 1024 * 1024
    assert _last(view["memory_bytes"][0]["points"]) > 0  # the job's shell and sleep, from /proc
    assert view["cpu_cores"][0]["node"] == "node-0"
    assert "Running" in [e["to"] for e in view["events"]]
    assert view["start"] <= view["events"][-1]["at"] <= view["end"]  # the events on the series' time axis
    # another user's job does not exist for bob; an admin reads it
    _get(api, bob, f"/api/v1/metrics/jobs/{busy}", 404)
    assert _last(_get(api, admin, f"/api/v1/metrics/jobs/{busy}")["gpu_utilisation"][0]["points"]) == 70.0


def test_the_cluster_view_counts_gpus_and_shows_only_my_idle_holders(cluster):
    api, admin, alice, bob, busy, idle = cluster
    view = _get(api, bob, "/api/v1/metrics/cluster?since=1h")
    (a100,) = view["models"]
    assert a100["model"] == "a100"
    assert (_last(a100["total"]), _last(a100["allocated"]), _last(a100["computing"]), _last(a100["idle"])) == (
        4,
        2,
        1,
        1,
    )
    assert _last(view["utilisation"]["allocated"]) == 36.0  # (70 + 2) / 2: a total, read by everyone
    assert [h["job"] for h in view["idle_holders"]] == [idle]  # bob's own only
    every = _get(api, admin, "/api/v1/metrics/cluster?since=1h")["idle_holders"]
    assert [(h["job"], h["user"], h["gpus"]) for h in every] == [(idle, "bob", 1), (busy, "alice", 1)]


def test_the_cluster_view_has_queue_waits_and_gpus_down(cluster):
    api, admin, alice, bob, _, _ = cluster
    big = _submit(api, alice, name="big", command=["true"], resources={"gpu": 4})  # waits for the two held GPUs

    def view():
        return _get(api, bob, "/api/v1/metrics/cluster?since=1h")

    def last(name):
        return {q["queue"]: _last(q[name]) for q in view()["queues"] if q[name]}

    try:
        wait_for(lambda: last("waiting").get("default") == 1, 30, what="the big job counted waiting")
        assert last("oldest_wait_s")["default"] > 0
        (default,) = [q for q in view()["queues"] if q["queue"] == "default"]
        assert default["started"] == 2 and set(default["wait_s"]) == {"0.5", "0.9", "0.99"}  # alice's and bob's
        assert 0 <= default["wait_s"]["0.5"] <= default["wait_s"]["0.99"] < 60
        # a queue of another account is not another user's to know of: neither its name nor its waits
        assert api.client.post("/api/v1/accounts", json={"name": "physics"}, headers=admin).status_code == 201
        outsider = api.user(admin, "olga", accounts=["physics"])
        assert _get(api, outsider, "/api/v1/metrics/cluster?since=1h")["queues"] == []
        assert "default" in {q["queue"] for q in _get(api, admin, "/api/v1/metrics/cluster?since=1h")["queues"]}
    finally:
        api.client.post(f"/api/v1/jobs/{big}/cancel", headers=alice)
    assert _last(view()["models"][0]["down"]) == 0
    assert api.client.post("/api/v1/admin/nodes/node-0/cordon", json={"reason": "fan"}, headers=admin).is_success
    try:
        wait_for(lambda: _last(view()["models"][0]["down"]) == 4, 30, what="the cordoned node's GPUs down")
    finally:
        api.client.post("/api/v1/admin/nodes/node-0/uncordon", headers=admin)


def test_a_long_cluster_chart_reads_the_recording_rules_with_the_same_counts(cluster):
    api, _, _, bob, _, _ = cluster
    wait_for(lambda: _get(api, bob, "/api/v1/metrics/cluster?since=7d")["recorded"], 30, what="rules evaluated")
    view = _get(api, bob, "/api/v1/metrics/cluster?since=7d")
    (a100,) = view["models"]
    assert [_last(a100[k]) for k in ("total", "allocated", "computing", "idle")] == [4, 2, 1, 1]
    assert _last(view["utilisation"]["allocated"]) == 36.0
    assert _get(api, bob, "/api/v1/metrics/cluster?since=1d")["recorded"] is False  # a short range: the raw series


def test_the_node_view_is_for_admins_and_says_who_held_each_gpu(cluster):
    api, admin, alice, _, busy, idle = cluster
    _get(api, alice, "/api/v1/metrics/nodes/node-0", 403)
    _get(api, admin, "/api/v1/metrics/nodes/nowhere", 404)
    view = _get(api, admin, "/api/v1/metrics/nodes/node-0?since=1h")
    assert [g["gpu"] for g in view["gpus"]] == ["0", "1", "2", "3"]
    total = api.client.app.state.platform.settings.fake_gpus[0].memory_mib * 1024 * 1024
    assert all(g["memory_total_bytes"] == total for g in view["gpus"])
    by_job = {h["job"]: h for h in view["holders"]}
    assert set(by_job) == {busy, idle} and by_job[busy]["user"] == "alice"
    held = next(g for g in view["gpus"] if g["gpu"] == by_job[busy]["gpu"])
    assert _last(held["utilisation"]) == 70.0 and by_job[busy]["from"] <= by_job[busy]["to"]


def test_gpu_hours_per_day_are_my_own_and_the_csv_is_everyones(cluster):
    api, admin, alice, _, _, _ = cluster
    mine = _get(api, alice, "/api/v1/usage/gpu-hours?since=1d&by=user")
    assert mine["available"] and mine["by"] == "user"
    (today,) = mine["days"]
    assert today["user"] == "alice" and today["day"] == time.strftime("%Y-%m-%d", time.gmtime())
    assert 0 < today["used_gpu_hours"] == pytest.approx(0.7 * today["allocated_gpu_hours"], rel=0.05)
    by_queue = _get(api, alice, "/api/v1/usage/gpu-hours?since=1d&by=queue")["days"]
    assert [r["queue"] for r in by_queue] == ["default"]
    _get(api, alice, "/api/v1/usage/gpu-hours?by=password", 400)
    _get(api, alice, "/api/v1/usage/gpu-hours?since=yesterday", 400)
    assert api.client.get("/api/v1/usage/gpu-hours.csv", headers=alice).status_code == 403
    r = api.client.get("/api/v1/usage/gpu-hours.csv?since=1d&by=user", headers=admin)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert sorted(row["user"] for row in rows) == ["alice", "bob"]
    assert all(float(row["allocated_gpu_hours"]) > 0 for row in rows)


def test_the_low_utilisation_list_ranks_idle_gpu_hours_for_admins_and_account_admins(cluster):
    api, admin, alice, bob, _, _ = cluster
    listed = _get(api, admin, "/api/v1/usage/idle-gpu-hours?since=1d")
    assert listed["available"] and listed["accounts"] is None
    bobs, alices = listed["rows"]  # bob's GPU idles at 2 %, alice's computes at 70 %: bob first
    assert (bobs["user"], alices["user"]) == ("bob", "alice")
    days = _get(api, admin, "/api/v1/usage/gpu-hours?since=1d&by=user")["days"]
    for row in (bobs, alices):  # the same figures as the GPU-hours per day
        mine = [d for d in days if d["user"] == row["user"]]
        assert row["allocated_gpu_hours"] == pytest.approx(sum(d["allocated_gpu_hours"] for d in mine), abs=1e-3)
        assert row["used_gpu_hours"] == pytest.approx(sum(d["used_gpu_hours"] for d in mine), abs=1e-3)
        assert row["idle_gpu_hours"] == pytest.approx(row["allocated_gpu_hours"] - row["used_gpu_hours"], abs=1e-3)
    assert bobs["used_percent"] == pytest.approx(2, abs=1) and alices["used_percent"] == pytest.approx(70, abs=5)
    by_account = _get(api, admin, "/api/v1/usage/idle-gpu-hours?since=1d&by=account")["rows"]
    assert [r["account"] for r in by_account] == ["default"]
    # a user who administers no account is refused; an account admin sees only their accounts' jobs
    _get(api, alice, "/api/v1/usage/idle-gpu-hours", 403)
    assert api.client.post("/api/v1/accounts", json={"name": "other-lab"}, headers=admin).status_code == 201
    heads = {account: api.user(admin, f"head-{account}", accounts=[account]) for account in ("default", "other-lab")}
    for account in heads:
        r = api.client.put(f"/api/v1/accounts/{account}/admins/head-{account}", json={"admin": True}, headers=admin)
        assert r.status_code == 200, r.text
    theirs = _get(api, heads["default"], "/api/v1/usage/idle-gpu-hours?since=1d")
    assert theirs["accounts"] == ["default"] and [r["user"] for r in theirs["rows"]] == ["bob", "alice"]
    assert _get(api, heads["other-lab"], "/api/v1/usage/idle-gpu-hours?since=1d")["rows"] == []
    _get(api, admin, "/api/v1/usage/idle-gpu-hours?by=queue", 400)
    # the portal's page: the same list, for the same people
    page = browser_for(api.client, "head-default", "password-123").get("/low-utilisation?by=user")
    assert page.status_code == 200
    assert (
        re.findall(r'<tr data-key="([^"]+)">', page.text) == ["bob", "alice"]
        and 'data-chart="idle-gpu-hours"' in page.text
    )
    assert browser_for(api.client, "alice", "password-123").get("/low-utilisation").status_code == 403


def test_the_gpus_held_now_are_mine_and_the_model_mean_is_everyones(cluster):
    api, _, alice, _, busy, _ = cluster
    view = _get(api, alice, "/api/v1/metrics/allocated?window_s=60")
    assert [(g["job"], g["user"]) for g in view["gpus"]] == [(busy, "alice")]
    (a100,) = view["models"]
    assert a100["model"] == "a100" and 2 < a100["mean_percent"] < 70  # both held GPUs


@pytest.mark.parametrize("hangs", [True, False])
def test_without_prometheus_every_view_says_why_within_its_time_box(tmp_path, hangs):
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    if hangs:
        listener.listen(16)  # accepts and never answers
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    s = make_settings(tmp_path, runtime="local", prometheus_url=url, prometheus_timeout_s=0.5)
    with api_on(s, None) as (api, admin):
        job = _submit(api, admin, name="x", command=["true"])
        started = time.monotonic()
        for path in (
            "/api/v1/metrics/cluster?since=30d",
            "/api/v1/metrics/nodes/node-0",
            f"/api/v1/metrics/jobs/{job}",
            "/api/v1/metrics/allocated",
            "/api/v1/usage/gpu-hours",
            "/api/v1/usage/idle-gpu-hours",
        ):
            view = _get(api, admin, path)
            assert view["available"] is False and url in view["reason"], path
        assert _get(api, admin, f"/api/v1/metrics/jobs/{job}")["events"]  # still the job's events
        r = api.client.get("/api/v1/usage/gpu-hours.csv", headers=admin)
        assert r.status_code == 503 and url in r.text
        assert time.monotonic() - started < 7 * 2 * 0.5 + 3  # each view within its budget: two time-outs
    listener.close()


def test_caldera_up_runs_without_metrics_when_the_agents_port_is_taken(tmp_path):
    import socket

    from caldera.server.metrics import start
    from caldera.server.platform import Platform

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        platform = Platform.create(make_settings(tmp_path, runtime="local", metrics_port=port))
        try:
            agent, proc, said = start(platform)
        finally:
            platform.engine.dispose()
    assert (agent, proc) == (None, None) and f"cannot listen on 127.0.0.1:{port}" in said
