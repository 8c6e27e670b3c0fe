"""Loaders on the real trace files."""

from __future__ import annotations

import time

import pytest

from caldera.core.tenancy import PriorityClass
from caldera.sim.cluster import ClusterSpec
from caldera.sim.traces import (
    TraceJob,
    load_alibaba,
    load_alibaba_nodes,
    load_gavel,
    load_philly,
    load_trace,
    split_gang,
    summarize,
    trace_path,
)


def _sorted_from_zero(jobs: list[TraceJob]) -> None:
    assert jobs[0].submit_time_s == 0.0
    submits = [j.submit_time_s for j in jobs]
    assert submits == sorted(submits)
    assert len({j.id for j in jobs}) == len(jobs)
    for j in jobs:
        assert j.duration_s >= 0
        assert j.replicas * j.gpus_per_replica == j.num_gpus


def test_split_gang() -> None:
    assert split_gang(1, 8) == (1, 1)
    assert split_gang(8, 8) == (1, 8)
    assert split_gang(16, 8) == (2, 8)
    assert split_gang(12, 8) == (2, 6)
    assert split_gang(24, 8) == (3, 8)
    assert split_gang(128, 8) == (16, 8)
    assert split_gang(7, 4) == (7, 1)  # prime: only single-GPU replicas add up to 7
    assert split_gang(0, 8) == (1, 0)


def test_philly(traces_dir) -> None:
    t0 = time.perf_counter()
    jobs = load_philly(traces_dir / "philly_jobs.csv")
    elapsed = time.perf_counter() - t0
    assert len(jobs) == 82_247
    assert elapsed < 5.0, f"loading Philly took {elapsed:.1f} s"
    _sorted_from_zero(jobs)
    assert all(j.duration_s >= 1 for j in jobs)
    assert {j.num_gpus for j in jobs} == {1, 2, 4, 8, 12, 16, 24, 32, 64, 128}
    s = summarize(jobs)
    assert s["accounts"] == 15
    assert s["jobs_per_account"]["6214e9"] == 41_226
    assert 108 * 86400 < s["submit_span_s"] < 110 * 86400
    assert s["gpu_seconds"] == pytest.approx(3_521_082_502.0)
    # gangs of node-sized replicas
    big = [j for j in jobs if j.num_gpus == 128]
    assert len(big) == 3 and all((j.replicas, j.gpus_per_replica) == (16, 8) for j in big)
    assert all(j.gpus_per_replica <= 8 for j in jobs)
    assert {j.account for j in jobs} == {j.user for j in jobs}
    assert all(j.priority is PriorityClass.NORMAL for j in jobs)


def test_philly_limit_and_by_name(traces_dir) -> None:
    jobs = load_trace("philly", traces_dir=traces_dir, limit=100, gpus_per_node=4)
    assert len(jobs) == 100
    _sorted_from_zero(jobs)
    assert all(j.gpus_per_replica <= 4 for j in jobs)
    assert trace_path("philly", traces_dir).name == "philly_jobs.csv"
    with pytest.raises(FileNotFoundError):
        load_trace("nope", traces_dir=traces_dir)
    with pytest.raises(ValueError):
        trace_path("alibaba-nope", traces_dir)


def test_gavel(traces_dir) -> None:
    tput = traces_dir.parent / "colocation" / "gavel_simulation_throughputs.json"
    stats: dict[str, int] = {}
    jobs = load_gavel(traces_dir / "gavel_msr_seed0", tput, stats=stats)
    assert len(jobs) == 1181 + 533 + 2000
    assert stats == {"no_throughput": 0, "estimated": 391}
    _sorted_from_zero(jobs)
    assert {j.account for j in jobs} == {"0e4a51", "2869ce", "6214e9"}
    assert all(j.duration_s > 0 for j in jobs)
    assert {j.num_gpus for j in jobs} <= {1, 2, 4, 8, 16, 32}
    # the first job of 0e4a51: Transformer (batch size 128), 95121 steps on one V100
    import json

    solo = json.loads(tput.read_text())["v100"]["('Transformer (batch size 128)', 1)"]["null"]
    first = next(j for j in jobs if j.id == "0e4a51-0")
    assert first.duration_s == pytest.approx(95121 / solo)

    skipped: dict[str, int] = {}
    strict = load_gavel(traces_dir / "gavel_msr_seed0", tput, missing="skip", stats=skipped)
    assert len(strict) == len(jobs) - 391 and skipped["no_throughput"] == 391
    one = load_trace(traces_dir / "gavel_msr_seed0" / "2869ce.trace", traces_dir=traces_dir)
    assert len(one) == 533 and {j.account for j in one} == {"2869ce"}


def test_alibaba(traces_dir) -> None:
    path = traces_dir / "alibaba_v2023_openb_pod_list_default.csv"
    stats: dict[str, int] = {}
    jobs = load_alibaba(path, stats=stats)
    assert stats == {"cpu_only": 1088, "unscheduled": 861}
    assert len(jobs) == 8152 - 1088 - 861
    _sorted_from_zero(jobs)
    assert {j.account for j in jobs} == {"ls", "be", "burstable", "guaranteed"}
    assert all(j.num_gpus >= 1 for j in jobs)  # fractional GPU pods count as one whole GPU
    assert {j.priority for j in jobs if j.account == "be"} == {PriorityClass.BEST_EFFORT}
    assert all(j.cpu is not None and j.memory_mib is not None for j in jobs)
    everything = load_alibaba(path, include_cpu_only=True, include_unscheduled=True, qos_priority=False)
    assert len(everything) == 8152
    assert all(j.priority is PriorityClass.NORMAL for j in everything)

    share = load_trace("alibaba-gpushare40", traces_dir=traces_dir)
    assert len(share) > 6000 and all(j.num_gpus >= 1 for j in share)

    nodes = load_alibaba_nodes(traces_dir / "alibaba_v2023_openb_node_list_gpu_node.csv")
    assert len(nodes) == 1213
    spec = ClusterSpec.from_alibaba_nodes(traces_dir / "alibaba_v2023_openb_node_list_gpu_node.csv")
    assert spec.num_nodes == 1213 and spec.total_gpus == sum(n.gpus for n in nodes)
    assert spec.max_gpus_per_node == 8
