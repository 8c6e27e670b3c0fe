"""run_sim: outputs and a multi-policy comparison on a slice of Philly."""

from __future__ import annotations

import json

from rich.console import Console
from typer.testing import CliRunner

from caldera.scheduler.registry import POLICIES
from caldera.sim.cli import app, run_sim
from caldera.sim.traces import TraceJob

WANTED = ("fifo", "tiresias", "caldera")


def _quiet() -> Console:
    return Console(file=open("/dev/null", "w"), width=200)


def test_json_and_png_are_written(tmp_path) -> None:
    jobs = [
        TraceJob("a", 0, 100, 1, "p", "p"),
        TraceJob("b", 10, 50, 1, "q", "q"),
        TraceJob("c", 300, 100, 1, "p", "p"),
    ]
    out = run_sim(jobs, ["fifo"], nodes=1, gpus_per_node=1, out_dir=tmp_path / "o", console=_quiet())
    data = json.loads((tmp_path / "o" / "results.json").read_text())
    assert out["json"] == str(tmp_path / "o" / "results.json")
    assert [r["policy"] for r in data["results"]] == ["fifo"]
    r = data["results"][0]
    assert r["jct_s"]["mean"] == (100 + 140 + 100) / 3
    assert r["makespan_s"] == 400
    assert r["gpu_allocation"]["mean"] == 250 / 400
    assert len(r["gpu_allocation"]["t_s"]) == len(r["gpu_allocation"]["rate"]) == 500
    assert data["config"]["cluster"]["total_gpus"] == 1
    png = (tmp_path / "o" / "comparison.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_compare_policies_on_philly_slice(tmp_path, traces_dir) -> None:
    policies = [p for p in WANTED if p in POLICIES]
    assert "fifo" in policies
    if len(policies) == 1:  # until the other policies are registered, compare FIFO with itself
        policies = ["fifo", "fifo"]
    out = run_sim(
        "philly",
        policies,
        traces_dir=traces_dir,
        limit=400,
        nodes=4,
        gpus_per_node=8,
        time_scale=0.05,
        out_dir=tmp_path,
        console=_quiet(),
    )
    res = out["results"]
    assert [r["policy"] for r in res] == policies
    for r in res:
        j = r["jobs"]
        assert j["submitted"] == 400
        assert j["completed"] + j["dropped_never_fit"] == 400, r["policy"]
        assert r["jct_s"]["mean"] > 0 and r["queueing_delay_s"]["p99"] >= 0
        assert 0 < r["gpu_allocation"]["mean"] <= 1
        assert 0 < r["fairness"]["jain_account_slowdown"] <= 1
        assert not r["invalid_decisions"], r["invalid_decisions"]
    # the same trace and cluster for all
    assert len({r["jobs"]["simulated"] for r in res}) == 1
    assert len({r["total_gpus"] for r in res}) == 1
    assert (tmp_path / "comparison.png").exists()


def test_cli(tmp_path, traces_dir) -> None:
    runner = CliRunner()
    r = runner.invoke(
        app,
        [
            "run",
            "philly",
            "--traces-dir",
            str(traces_dir),
            "--limit",
            "50",
            "--nodes",
            "2",
            "-p",
            "fifo",
            "--time-scale",
            "0.1",
            "--out",
            str(tmp_path),
            "--no-plot",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "fifo" in r.output and (tmp_path / "results.json").exists()
    assert not (tmp_path / "comparison.png").exists()
    r = runner.invoke(app, ["run", "philly", "-p", "nope", "--out", str(tmp_path)])
    assert r.exit_code != 0
    r = runner.invoke(app, ["info", "gavel", "--traces-dir", str(traces_dir)])
    assert r.exit_code == 0 and "3714" in r.output.replace(",", "")
    r = runner.invoke(app, ["policies"])
    assert "fifo" in r.output


def test_cli_leaves_out_unmeasured_gavel_jobs_on_request(tmp_path, traces_dir) -> None:
    """--skip-unmeasured replays only the jobs Gavel measured a throughput for (as Gavel's own simulator), and is
    refused, not a traceback, for a trace without throughputs."""
    import json

    trace = str(traces_dir / "gavel_msr_seed0" / "0e4a51.trace")
    common = ["-p", "fifo", "--nodes", "8", "--no-plot", "--time-scale", "0.01"]
    r = CliRunner().invoke(app, ["run", trace, "--skip-unmeasured", "--out", str(tmp_path), *common])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "results.json").read_text())["config"]["jobs"] == 984  # of its 1,181 jobs
    r = CliRunner().invoke(app, ["run", "philly", "--traces-dir", str(traces_dir), "--skip-unmeasured", *common])
    assert r.exit_code == 1 and "Gavel's traces only" in r.output
