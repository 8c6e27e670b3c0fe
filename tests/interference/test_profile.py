"""``caldera profile`` on the CPU: two tiny workloads alone and together, records with the reference columns, and
the decay model retrained from them. (The GPU path -- NVML sampling, per-process memory fraction -- needs a GPU.)"""

from __future__ import annotations

import csv

import pytest
from typer.testing import CliRunner

from caldera.interference.profile.harness import COLOC_COLUMNS, SOLO_COLUMNS
from caldera.interference.profile.zoo import WORKLOADS, build
from caldera.interference.records import JobType, load_profile_records

torch = pytest.importorskip("torch")


def test_every_zoo_workload_takes_a_training_step():
    torch.set_num_threads(1)
    for name in WORKLOADS:
        w = build(name, 2)
        before = [p.detach().clone() for p in w.model.parameters()]
        loss = w.loss(w.model, w.batch())
        loss.backward()
        torch.optim.SGD(w.model.parameters(), lr=0.1).step()
        assert torch.isfinite(loss), name
        assert any(not torch.equal(a, b) for a, b in zip(before, w.model.parameters())), name
    assert len(WORKLOADS) == 16


def test_profile_two_workloads_alone_and_as_a_mix(tmp_path):
    from caldera.cli.main import app

    args = ["profile", "--workloads", "neumf,pointnet", "--batch-sizes", "4", "--seconds", "0.3"]
    r = CliRunner().invoke(app, [*args, "--min-iters", "3", "--device", "cpu", "--out", str(tmp_path)])
    assert r.exit_code == 0, r.output
    solo = list(csv.DictReader((tmp_path / "solo.csv").open()))
    assert list(solo[0]) == SOLO_COLUMNS
    assert {s["model"] for s in solo} == {"neumf", "pointnet"}
    for s in solo:
        assert float(s["speed"]) > 0 and float(s["iter_avg_ms"]) == pytest.approx(1000 / float(s["speed"]))
        assert float(s["cpu_mem_max"]) > 50 and float(s["cpu_usage"]) > 0
        assert s["gpu"] == "cpu" and s["gpu_util_avg"] == "" and s["sm_active_avg"] == ""  # not measured: empty
    coloc = list(csv.DictReader((tmp_path / "coloc.csv").open()))
    assert list(coloc[0]) == COLOC_COLUMNS and len(coloc) == 2
    by_model = {c["model"]: c for c in coloc}
    assert by_model["neumf"]["co_models"] == "pointnet@4"
    for c in coloc:
        assert float(c["decay"]) == pytest.approx(max(0.0, 1 - float(c["co_speed"]) / float(c["speed"])))
    other = {c["model"]: s for c in coloc for s in solo if s["model"] != c["model"]}
    assert float(by_model["neumf"]["cosum_cpu_usage"]) == pytest.approx(float(other["neumf"]["cpu_usage"]))

    ds = load_profile_records(tmp_path)  # the platform's own records feed the decay model
    assert set(ds.profiles) == {JobType("neumf", 4), JobType("pointnet", 4)}
    assert len(ds.samples) == 2 and ds.profiles[JobType("neumf", 4)].solo["cpu"] > 0
