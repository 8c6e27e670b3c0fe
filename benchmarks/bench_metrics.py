"""The figures of docs/metrics.md: what the node agent costs, what it exposes, and how fast the views read Prometheus.

    python benchmarks/bench_metrics.py [--rounds 20] [--gpus 8] [--jobs 50] [--days 30] [--resolution 240]
        [--requests 30]

1. Agent: 8 fake GPUs and 50 running jobs (50 real ``sleep`` processes, each a job with a gpu_load.json, spread over
   the GPUs), ``rounds`` samples; the agent's CPU time per round (this process's CPU clock: the agent is a thread of
   ``caldera up``) divided by the 5 s interval is its CPU % of one core. The scrape: the bytes of one exposition.
2. Views: ``days`` of synthetic series for the ``gpus`` GPUs of one node (each GPU held by a job changing every
   12 hours, one job holding GPU 0 for the last 7 days), one sample every ``resolution`` seconds, written as
   OpenMetrics and turned into day-long TSDB blocks by ``promtool tsdb create-blocks-from openmetrics``; Debian's
   Prometheus started on them; then ``requests`` calls each, through the API (FastAPI's TestClient, so routing, auth
   and JSON included), of the 7-day job chart and of the 30-day cluster chart: median and p95. Prometheus' disk: the
   blocks' bytes per sample, and per GPU-day at the 5 s interval (5 series per GPU for the fake source: utilisation,
   memory used and total, and the holding job's utilisation and memory).
   The 30-day cluster chart is timed twice: on the raw series (no recorded series yet: the view falls back), then
   after the platform's recording rules are backfilled over the 30 days by ``promtool tsdb create-blocks-from rules``
   (what Prometheus would have recorded had the rules run all month) and Prometheus restarted on those blocks.
   Before each timing Prometheus compacts what it was started on (the rules' backfill writes a block per rule and
   2 hours, some 1,800; a month of running leaves a handful), and the figure says how many blocks it then reads.
Prints one JSON object per figure. Needs prometheus and promtool (apt-get install prometheus).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from caldera.config import FakeGpu, Settings  # noqa: E402
from caldera.metrics.agent import Agent  # noqa: E402
from caldera.metrics.sources.base import Holding  # noqa: E402
from caldera.metrics.sources.fake.source import LOAD_FILE, FakeSource  # noqa: E402

INTERVAL_S = 5.0
DAY = 86400


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def bench_agent(tmp: Path, gpus: int, jobs: int, rounds: int) -> dict:
    settings = Settings(data_dir=tmp, runtime="local", fake_gpus=[FakeGpu(model="a100")] * gpus)
    sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(jobs)]
    try:
        holdings = []
        for i, proc in enumerate(sleepers):
            workdir = tmp / "runs" / f"job{i}"
            workdir.mkdir(parents=True)
            (workdir / LOAD_FILE).write_text(json.dumps({"utilisation": 10 + i % 90, "memory_mib": 100 * i}))
            holdings.append(
                Holding(
                    f"job{i}", f"user{i % 7}", "lab", "default", (i % gpus,), 0.0, pids=(proc.pid,), workdir=workdir
                )
            )
        agent = Agent("node-0", FakeSource(settings), lambda: holdings)
        agent.sample_once()  # warm: imports, first /proc reads
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(rounds):
            agent.sample_once()
        cpu_per_round = (time.process_time() - cpu) / rounds
        wall_per_round = (time.perf_counter() - wall) / rounds
        from prometheus_client import generate_latest

        scrape = generate_latest(agent.registry)
        processes = sum(1 for p in os.listdir("/proc") if p.isdigit())
    finally:
        for proc in sleepers:
            proc.kill()
            proc.wait()
    return {
        "figure": "agent",
        "gpus": gpus,
        "jobs": jobs,
        "rounds": rounds,
        "host_processes": processes,  # the process runtime's stats walk /proc: its cost grows with them
        "cpu_ms_per_round": round(cpu_per_round * 1000, 2),
        "wall_ms_per_round": round(wall_per_round * 1000, 2),
        "cpu_percent_of_one_core_at_5s": round(100 * cpu_per_round / INTERVAL_S, 3),
        "scrape_bytes": len(scrape),
        "scrape_series": sum(1 for line in scrape.decode().splitlines() if line and not line.startswith("#")),
    }


def _util(gpu: int, t: float) -> float:
    """A utilisation that moves like a training job's: busy with dips, a little different per GPU."""
    return round(max(0.0, min(100.0, 60 + 35 * math.sin(t / 3700 + gpu) + 5 * math.sin(t / 97))), 1)


def write_openmetrics(path: Path, gpus: int, days: int, resolution: int, end: float, long_job: str) -> int:
    """Synthetic series for one node; returns the number of samples."""
    start = end - days * DAY
    times = [start + k * resolution for k in range(int((end - start) // resolution) + 1)]
    week_ago = end - 7 * DAY

    def holder(gpu: int, t: float) -> tuple[str, str]:
        if gpu == 0 and t >= week_ago:
            return long_job, "admin"
        n = int(t // (DAY / 2))
        return f"bench-{gpu}-{n}", f"user{(gpu + n) % 5}"

    samples = 0
    total = 80 * 1024**3
    with open(path, "w") as out:
        for name, value in (
            ("caldera_gpu_utilisation_percent", lambda g, t: _util(g, t)),
            ("caldera_gpu_memory_used_bytes", lambda g, t: int(_util(g, t) / 100 * total)),
            ("caldera_gpu_memory_total_bytes", lambda g, t: total),
        ):
            out.write(f"# TYPE {name} gauge\n")
            for g in range(gpus):
                labels = f'gpu="{g}",gpu_model="a100",node="node-0"'
                for t in times:
                    out.write(f"{name}{{{labels}}} {value(g, t)} {t:.0f}\n")
                    samples += 1
        for name, value in (
            ("caldera_job_gpu_utilisation_percent", lambda g, t: _util(g, t)),
            ("caldera_job_gpu_memory_used_bytes", lambda g, t: int(_util(g, t) / 100 * total)),
        ):
            out.write(f"# TYPE {name} gauge\n")
            for g in range(gpus):
                for t in times:
                    job, user = holder(g, t)
                    labels = (
                        f'account="lab",gpu="{g}",gpu_model="a100",job="{job}",node="node-0",queue="default",'
                        f'user="{user}"'
                    )
                    out.write(f"{name}{{{labels}}} {value(g, t)} {t:.0f}\n")
                    samples += 1
        for name, value in (
            ("caldera_job_cpu_seconds", lambda t: round((t - week_ago) * 3.5, 1)),
            ("caldera_job_memory_bytes", lambda t: 12 * 1024**3),
        ):
            out.write(f"# TYPE {name} gauge\n")
            labels = f'account="lab",job="{long_job}",node="node-0",queue="default",user="admin"'
            for t in times:
                if t >= week_ago:
                    out.write(f"{name}{{{labels}}} {value(t)} {t:.0f}\n")
                    samples += 1
        out.write("# EOF\n")
    return samples


def _cpu_s(pid: int) -> float:
    """User and system CPU time of a process so far: what a request costs Prometheus, whatever the machine's load."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _timed(client, path: str, headers: dict, n: int, prometheus_pid: int) -> dict:
    cpu = _cpu_s(prometheus_pid)
    took = []
    for _ in range(n):
        started = time.perf_counter()
        r = client.get(path, headers=headers)
        took.append(time.perf_counter() - started)
        assert r.status_code == 200 and r.json()["available"], r.text
    took.sort()
    return {
        "median_ms": round(statistics.median(took) * 1000, 1),
        "p95_ms": round(took[max(0, math.ceil(0.95 * n) - 1)] * 1000, 1),
        "prometheus_cpu_ms_per_request": round((_cpu_s(prometheus_pid) - cpu) / n * 1000, 1),
        "load_average": round(os.getloadavg()[0], 1),  # the machine is shared: how busy it was meanwhile
    }


def _compacted(settings: Settings, timeout_s: float = 300) -> int:
    """Waits until Prometheus has compacted the blocks it was started on (backfilled day blocks, and the rules'
    backfill's one block per rule and 2 hours) as it would have over a month of running; the blocks loaded then."""
    from caldera.metrics import prometheus

    def tsdb() -> dict[str, float]:
        text = urllib.request.urlopen(prometheus.url(settings) + "/metrics", timeout=10).read().decode()
        wanted = ("prometheus_tsdb_blocks_loaded ", "prometheus_tsdb_compactions_total ")
        return {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line.startswith(wanted)}

    deadline, last = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        now = tsdb()
        if now == last and now["prometheus_tsdb_compactions_total"] > 0:
            break
        last = now
        time.sleep(15)  # the compactor runs once a minute
    return int(tsdb()["prometheus_tsdb_blocks_loaded"])


def _backfill_rules(settings: Settings, blocks: Path, start: float) -> None:
    """The rules file the platform wrote for its Prometheus, evaluated over the past by promtool into ``blocks``."""
    from caldera.metrics import prometheus

    root = settings.data_dir / "prometheus"
    out = root / "rule-blocks"
    subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "rules", "-q", f"--url={prometheus.url(settings)}",
         f"--start={int(start)}", f"--end={int(time.time())}", f"--output-dir={out}", str(root / "rules.yml")],
        check=True,
    )  # fmt: skip
    for block in out.iterdir():
        block.rename(blocks / block.name)


def bench_views(tmp: Path, gpus: int, days: int, resolution: int, requests: int) -> list[dict]:
    from fastapi.testclient import TestClient
    from sqlalchemy import update

    from caldera.db.models import Job
    from caldera.metrics import prometheus
    from caldera.server.app import create_app
    from caldera.server.platform import Platform
    from caldera.server.tenancy import bootstrap

    if not (shutil.which("prometheus") and shutil.which("promtool")):
        return [{"figure": "views", "skipped": "prometheus or promtool not installed"}]
    settings = Settings(
        data_dir=tmp / "views",
        runtime="local",
        run_jobs_as="server",
        fake_gpus=[FakeGpu(model="a100")] * gpus,
        node_name="node-0",
        metrics_interval_s=INTERVAL_S,
        prometheus_port=free_port(),
        prometheus_timeout_s=10,
    )
    platform = Platform.create(settings)
    with platform.session() as db:
        bootstrap(db, "admin-password")
        db.commit()
    now = time.time()
    with TestClient(create_app(platform, run_loop=False)) as client:
        token = client.post("/api/v1/auth/login", json={"username": "admin", "password": "admin-password"}).json()
        headers = {"Authorization": f"Bearer {token['access_token']}"}
        job = client.post("/api/v1/jobs", json={"name": "week", "command": "true"}, headers=headers).json()["id"]
        with platform.session() as db:  # a job that ran for the last 7 days (the loop never ran: no events)
            db.execute(update(Job).where(Job.id == job).values(submitted_at=now - 7 * DAY, finished_at=now))
            db.commit()
        source = tmp / "series.om"
        started = time.perf_counter()
        samples = write_openmetrics(source, gpus, days, resolution, now - 600, job)
        blocks = settings.data_dir / "prometheus" / "data"
        blocks.mkdir(parents=True)
        # blocks of a day, as Prometheus' own compaction would have made of a month (2 h blocks until then)
        make = ["promtool", "tsdb", "create-blocks-from", "openmetrics", "-q", "--max-block-duration=24h"]
        subprocess.run([*make, str(source), str(blocks)], check=True)
        backfill_s = time.perf_counter() - started
        disk = sum(f.stat().st_size for f in blocks.rglob("*") if f.is_file())
        source.unlink()
        proc = prometheus.start_local(settings, [], wait_s=120)
        try:
            raw_blocks = _compacted(settings)
            job_chart = _timed(client, f"/api/v1/metrics/jobs/{job}", headers, requests, proc.pid)
            cluster_raw = _timed(client, "/api/v1/metrics/cluster?since=30d", headers, requests, proc.pid)
            started = time.perf_counter()
            _backfill_rules(settings, blocks, now - days * DAY)
            rules_s = round(time.perf_counter() - started, 1)
        finally:
            proc.terminate()
            proc.wait(20)
        proc = prometheus.start_local(settings, [], wait_s=120)
        try:
            all_blocks = _compacted(settings)
            assert client.get("/api/v1/metrics/cluster?since=30d", headers=headers).json()["recorded"]
            cluster_recorded = _timed(client, "/api/v1/metrics/cluster?since=30d", headers, requests, proc.pid)
        finally:
            proc.terminate()
            proc.wait(20)
    platform.engine.dispose()
    per_sample = disk / samples
    return [
        {
            "figure": "backfill",
            "gpus": gpus,
            "days": days,
            "resolution_s": resolution,
            "samples": samples,
            "seconds": round(backfill_s, 1),
            "block_bytes": disk,
            "bytes_per_sample": round(per_sample, 3),
            "bytes_per_gpu_day_at_5s": round(per_sample * 5 * DAY / INTERVAL_S),
        },
        {"figure": "job chart, 7 days", "requests": requests, **job_chart},
        {"figure": "cluster chart, 30 days, raw series", "requests": requests, "blocks": raw_blocks, **cluster_raw},
        {"figure": "recording rules backfilled", "days": days, "seconds": rules_s},
        {
            "figure": "cluster chart, 30 days, recorded series",
            "requests": requests,
            "blocks": all_blocks,
            **cluster_recorded,
        },  # fmt: skip
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--resolution", type=int, default=240, help="seconds between synthetic samples")
    ap.add_argument("--requests", type=int, default=30)
    a = ap.parse_args()
    print(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load": os.getloadavg()}))
    with tempfile.TemporaryDirectory(prefix="bench-metrics-") as tmp:
        print(json.dumps(bench_agent(Path(tmp), a.gpus, a.jobs, a.rounds)), flush=True)
        for figure in bench_views(Path(tmp), a.gpus, a.days, a.resolution, a.requests):
            print(json.dumps(figure), flush=True)


if __name__ == "__main__":
    main()
