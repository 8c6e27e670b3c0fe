"""The sharing simulator: real speeds from the ground truth, the scheduler told only predictions."""

from __future__ import annotations

import pytest

from caldera.interference.predictor import TablePredictor
from caldera.interference.records import Dataset, JobType, Profile
from caldera.sim.sharing_sim import ShareJob, ShareSim, compare, fit_memory

A, B, C = JobType("A", 8), JobType("B", 8), JobType("C", 8)


def tiny_world() -> Dataset:
    """On one V100: A and B slow each other a little (speed ratios 0.8 / 0.9); anything with C badly (0.3)."""
    ds = Dataset({t: Profile(t, {"v100": 1.0}) for t in (A, B, C)}, [])
    ratios = {(A, B): 0.8, (B, A): 0.9, (A, A): 0.5, (B, B): 0.5, (C, C): 0.3}
    for x in (A, B):
        ratios[(x, C)] = ratios[(C, x)] = 0.3
    ds.ratios.update({("v100", x, y): r for (x, y), r in ratios.items()})
    return ds


def jobs(*spec: tuple[str, JobType, float, float]) -> list[ShareJob]:
    return [ShareJob(i, t, arrival, work, 1, remaining=work) for i, t, arrival, work in spec]


def test_co_located_jobs_run_at_ground_truth_speed_and_aware_avoids_bad_pairs():
    ds = tiny_world()
    truth = TablePredictor({("v100", x, y): 1 - r for (_, x, y), r in ds.ratios.items()})
    # one GPU; A runs, then B and C arrive: aware pairs A with B only, naive takes whatever comes first
    js = jobs(("a", A, 0.0, 100.0), ("c", C, 1.0, 100.0), ("b", B, 2.0, 100.0))
    exclusive, naive, aware = compare(ds, js, truth, nodes=1, gpus_per_node=1, tolerance=0.3)
    assert exclusive.colocations == 0 and exclusive.eff_util_busy == pytest.approx(1.0)
    assert exclusive.makespan_s == pytest.approx(300.0)
    assert naive.bad_colocations >= 1  # c next to a: decays 0.7
    assert aware.bad_colocations == 0 and aware.colocations >= 1
    assert aware.eff_util_busy > 1.0 and aware.avg_jct_s < exclusive.avg_jct_s
    # a alone for 2 s, then with b (a at 0.8, b at 0.9): b ends at 2 + 100 / 0.9; a, alone again, has
    # 100 - 2 - 0.8 * 100 / 0.9 left; c never joins a and starts when a ends
    b_end = 2 + 100 / 0.9
    a_end = b_end + 100 - 2 - 0.8 * 100 / 0.9
    assert aware.jobs == 3
    assert aware.avg_jct_s == pytest.approx((a_end + (b_end - 2) + (a_end + 100 - 1)) / 3)


def test_memory_requests_reproduce_the_pairs_that_did_not_fit():
    ds = tiny_world()
    ds.infeasible.add(("v100", frozenset((C,))))  # C next to C did not fit
    mem = fit_memory(ds, "v100", [A, B, C], capacity=1000)
    assert 2 * mem[C] > 1000 and mem[A] + mem[B] <= 1000 and mem[A] + mem[C] <= 1000


def test_caldera_sim_sharing_compares_the_three_policies(gavel_file) -> None:
    pytest.importorskip("sklearn")
    from typer.testing import CliRunner

    from caldera.sim.cli import app

    data_dir = gavel_file.parent.parent
    if not (data_dir / "traces" / "gavel_msr_seed0").is_dir():
        pytest.skip("Gavel's traces are not in the shared data")
    r = CliRunner().invoke(app, ["sharing", "--data-dir", str(data_dir), "--limit", "150", "--nodes", "1"])
    assert r.exit_code == 0, r.output
    rows = {line.split("|")[1].strip(): line.split("|") for line in r.output.splitlines() if line.startswith("| ")}
    assert {"exclusive FIFO", "naive packing", "interference-aware"} <= rows.keys()
    assert rows["exclusive FIFO"][2].strip() == "1.000"  # exclusive: one normalised throughput per busy GPU
    assert float(rows["interference-aware"][2]) > 1.0  # sharing raised it
    assert int(rows["interference-aware"][8]) <= int(rows["naive packing"][8])  # no more bad co-locations
    assert "held-out V100 samples: MAE" in r.output


def test_gangs_share_their_gpus_with_a_gang_of_their_own_size_when_asked():
    """Gavel measured no gang pair; with ``share_gangs`` each rank is assumed to run as the one-GPU versions of the
    two types did side by side."""
    G, H, One = JobType("G", 8, 2), JobType("H", 8, 2), JobType("One", 8, 1)
    G1, H1 = JobType("G", 8, 1), JobType("H", 8, 1)
    ds = Dataset({t: Profile(t, {"v100": 1.0}) for t in (G, H, One, G1, H1)}, [])
    ds.ratios.update({("v100", G1, H1): 0.8, ("v100", H1, G1): 0.7, ("v100", One, One): 0.5})
    for x in (G1, H1):
        ds.ratios[("v100", x, x)] = 0.5
    ds.ratios.update({("v100", x, y): 0.0 for x in (G, H) for y in (G, H)})  # as in Gavel's file
    truth = TablePredictor({("v100", x, y): 1 - r for (_, x, y), r in ds.ratios.items() if r > 0})
    js = [ShareJob("g", G, 0.0, 100.0, 2, remaining=100.0), ShareJob("h", H, 1.0, 100.0, 2, remaining=100.0)]
    js.append(ShareJob("one", One, 2.0, 10.0, 1, remaining=10.0))
    # two GPUs: h joins g on both GPUs (g at 0.8, h at 0.7); the one-GPU job may not join one GPU of the pair
    exclusive, _, aware = compare(ds, js, truth, nodes=1, gpus_per_node=2, tolerance=0.35, share_gangs=True)
    assert (aware.colocations, aware.gang_colocations) == (1, 1)
    # g (99 steps left at 0.8) ends at 1 + 99 / 0.8; h, alone then, ends when its 100 steps are done; the
    # one-GPU job runs last
    g_end = 1 + 99 / 0.8
    h_end = g_end + 100 - 0.7 * (g_end - 1)
    assert aware.makespan_s == pytest.approx(h_end + 10.0)
    gang_gpu_s = 2 * h_end
    assert aware.gang_share == pytest.approx(gang_gpu_s / (gang_gpu_s + 10.0))
    assert aware.eff_util_gangs == pytest.approx((2 * 1 + 2 * 1.5 * (g_end - 1) + 2 * (h_end - g_end)) / gang_gpu_s)
    # by default (no gang sharing) h waits for g, then the one-GPU job for both
    _, _, apart = compare(ds, js, truth, nodes=1, gpus_per_node=2, tolerance=0.35)
    assert apart.colocations == 0 and apart.makespan_s == pytest.approx(210.0)
    assert exclusive.makespan_s == pytest.approx(210.0)


def test_the_regressor_is_chosen_on_pairs_of_the_training_data_only(gavel_file) -> None:
    """``estimator="auto"`` scores candidates on half of the *training* pairs: none of them is a held-out pair,
    and every one has its V100 samples among the training data."""
    pytest.importorskip("sklearn")
    from caldera.interference.records import load_gavel_pairs
    from caldera.sim.sharing_experiment import validation_errors
    from caldera.sim.sharing_sim import held_out_pairs, is_held_out

    ds = load_gavel_pairs(gavel_file)
    outer = held_out_pairs(ds, "v100", 0)
    trained = [s for s in ds.samples if not is_held_out(s, outer)]
    inner = held_out_pairs(ds, "v100", [0, 1], samples=trained)
    training_pairs = {("v100", frozenset((s.target, *s.corunners))) for s in trained if s.gpu == "v100"}
    assert inner and not inner & outer and inner <= training_pairs
    assert 0.3 < len(inner) / len(training_pairs) < 0.7
    errors = validation_errors(ds, trained, ("extra_trees", "svr"), seed=0)
    assert set(errors) == {"extra_trees", "svr"} and all(0 < e < 0.5 for e in errors.values())


def test_only_the_named_runs_are_replayed_with_the_given_simulator():
    ds = tiny_world()
    truth = TablePredictor({("v100", x, y): 1 - r for (_, x, y), r in ds.ratios.items()})
    js = jobs(("a", A, 0.0, 100.0), ("b", B, 2.0, 100.0))
    made = []

    def counting_sim(*args, **kw):
        made.append(ShareSim(*args, **kw))
        return made[-1]

    (aware,) = compare(
        ds, js, truth, nodes=1, gpus_per_node=1, tolerance=0.3, only={"interference-aware"}, sim_class=counting_sim
    )
    assert aware.policy == "interference-aware" and aware.colocations == 1
    assert len(made) == 1 and made[0].info is not None and made[0].info.default_tolerance == 0.3
