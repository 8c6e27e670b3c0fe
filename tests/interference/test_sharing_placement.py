"""Sharing placement (caldera/scheduler/sharing.py): pure, on snapshots built by tests/builders.py."""

from __future__ import annotations

import dataclasses

import pytest

from caldera.core.cluster import Allocation
from caldera.core.spec import SpecError, parse_spec
from caldera.core.tenancy import QueueConfig
from caldera.scheduler.fifo import FifoPolicy
from caldera.scheduler.reasons import said_reasons, specific_reasons
from caldera.scheduler.sharing import SharingInfo, SharingPolicy
from caldera.scheduler.snapshot import Decisions, SchedJob, Start
from caldera.scheduler.validation import decision_errors
from tests.builders import job, node, running, snapshot

GPU_MEM = 81920  # the builders' a100


def shared(j: SchedJob, mem: int = 20000, tolerance: float | None = None, shareable: bool = True) -> SchedJob:
    req = j.request.model_copy(update={"gpu_memory_mib": mem})
    return dataclasses.replace(j, request=req, shareable=shareable, decay_tolerance=tolerance)


def info(decay: dict, workload: dict, **kw) -> SharingInfo:
    return SharingInfo({("a100", tuple(sorted(k))): v for k, v in decay.items()}, workload, **kw)


def pair(a: str, b: str, da: float, db: float) -> dict:
    """The table entry for the mix {a, b}: decays in the sorted order of the keys."""
    return {(a, b): (da, db) if a < b else (db, da)}


def run(snap, aware=True):
    return SharingPolicy(FifoPolicy(), aware=aware)(snap)


def full_cluster(*occupants: SchedJob, queued: list[SchedJob], sharing: SharingInfo):
    snap = snapshot([node("n0", gpus=len(occupants))], queued, list(occupants))
    snap.sharing = sharing
    return snap


def test_shares_where_predicted_decays_fit_and_picks_the_best_gpu():
    r0 = shared(running("r0", {"n0": [0]}))
    r1 = shared(running("r1", {"n0": [1]}))
    q = shared(job("q"))
    table = {**pair("heavy", "new", 0.25, 0.28), **pair("light", "new", 0.05, 0.1)}
    snap = full_cluster(r0, r1, queued=[q], sharing=info(table, {"r0": "heavy", "r1": "light", "q": "new"}))
    d = run(snap)
    assert [(s.job_id, s.allocations[0].gpus) for s in d.starts] == [("q", (1,))]  # next to the light job
    assert "q" not in d.pending and d.wake_at == snap.now


def test_no_share_when_any_job_of_the_mix_would_decay_past_its_tolerance():
    r0 = shared(running("r0", {"n0": [0]}), tolerance=0.1)  # the running job accepts little slowdown
    q = shared(job("q"), tolerance=0.9)
    snap = full_cluster(r0, queued=[q], sharing=info(pair("a", "b", 0.2, 0.05), {"r0": "a", "q": "b"}))
    assert run(snap).starts == []
    # a per-queue tolerance applies to jobs without their own
    r0 = dataclasses.replace(r0, decay_tolerance=None)
    snap = full_cluster(r0, queued=[q], sharing=info(pair("a", "b", 0.2, 0.05), {"r0": "a", "q": "b"}))
    snap.queues = {"q": QueueConfig(name="q", account="a", decay_tolerance=0.25)}
    assert [s.job_id for s in run(snap).starts] == ["q"]


def test_unknown_jobs_exclusive_jobs_and_memory_are_respected():
    table = pair("a", "b", 0.1, 0.1)
    # the queued job has no profile: it waits (aware), although memory fits
    snap = full_cluster(shared(running("r0", {"n0": [0]})), queued=[shared(job("q"))], sharing=info(table, {"r0": "a"}))
    assert run(snap).starts == []
    # naive packing shares it anyway
    assert [s.job_id for s in run(snap, aware=False).starts] == ["q"]
    # an exclusive running job is never co-located with, even naively
    excl = running("r0", {"n0": [0]})
    snap = full_cluster(excl, queued=[shared(job("q"))], sharing=info(table, {"r0": "a", "q": "b"}))
    assert run(snap).starts == [] and run(snap, aware=False).starts == []
    # an exclusive queued job never joins a shared GPU
    snap = full_cluster(
        shared(running("r0", {"n0": [0]})), queued=[job("q")], sharing=info(table, {"r0": "a", "q": "b"})
    )
    assert run(snap, aware=False).starts == []
    # GPU memory: 60000 + 30000 > 81920
    r0 = shared(running("r0", {"n0": [0]}), mem=60000)
    snap = full_cluster(r0, queued=[shared(job("q"), mem=30000)], sharing=info(table, {"r0": "a", "q": "b"}))
    assert run(snap).starts == [] and run(snap, aware=False).starts == []


def test_max_jobs_per_gpu_and_free_gpus_first():
    table = pair("a", "b", 0.1, 0.1)
    r0 = shared(running("r0", {"n0": [0]}))
    q1, q2 = shared(job("q1", queued_since=1.0)), shared(job("q2", queued_since=2.0))
    snap = full_cluster(r0, queued=[q1, q2], sharing=info(table, {"r0": "a", "q1": "b", "q2": "b"}))
    assert [s.job_id for s in run(snap, aware=False).starts] == ["q1"]  # two per GPU by default
    # with a free GPU, the inner policy starts the job there exclusively; sharing only fills the rest
    snap = snapshot([node("n0", gpus=2)], [q1, q2], [r0])
    snap.sharing = info(table, {"r0": "a", "q1": "b", "q2": "b"})
    d = run(snap)
    assert {s.job_id: s.allocations[0].gpus for s in d.starts} == {"q1": (1,), "q2": (0,)}


def test_no_sharing_info_means_plain_inner_policy():
    snap = snapshot([node("n0", gpus=1)], [shared(job("q"))], [shared(running("r0", {"n0": [0]}))])
    assert run(snap).starts == []


def test_spec_shareable_needs_one_gpu_and_a_memory_request():
    ok = parse_spec({"name": "s", "command": "x", "shareable": True, "resources": {"gpu": 1, "gpu_memory_mib": 8000}})
    assert ok.shareable and ok.decay_tolerance is None
    with pytest.raises(SpecError):
        parse_spec({"name": "s", "command": "x", "shareable": True, "resources": {"gpu": 1}})
    with pytest.raises(SpecError):
        parse_spec({"name": "s", "command": "x", "shareable": True, "resources": {"gpu": 2, "gpu_memory_mib": 1}})
    with pytest.raises(SpecError):
        parse_spec({"name": "s", "command": "x", "decay_tolerance": 1.5})


def test_prefer_gain_moves_a_start_from_a_free_gpu_onto_a_good_partner():
    r0 = shared(running("r0", {"n0": [0]}))
    q = shared(job("q"))
    table = pair("a", "b", 0.05, 0.1)  # gain 0.85
    for prefer, gpu in ((0.8, 0), (0.9, 1), (None, 1)):
        snap = snapshot([node("n0", gpus=2)], [q], [r0])
        snap.sharing = info(table, {"r0": "a", "q": "b"}, prefer_gain=prefer)
        d = run(snap)
        assert [(s.job_id, s.allocations[0].gpus) for s in d.starts] == [("q", (gpu,))], prefer
    # never in naive mode, and never for a job the inner policy did not approve
    snap.sharing = info(table, {"r0": "a", "q": "b"}, prefer_gain=0.1)
    assert [s.allocations[0].gpus for s in run(snap, aware=False).starts] == [(1,)]


def test_why_names_the_closest_refused_mix_and_its_tolerance():
    r0 = shared(running("r0", {"n0": [0]}))
    q = shared(job("q"))
    snap = full_cluster(r0, queued=[q], sharing=info(pair("a", "b", 0.2, 0.4), {"r0": "a", "q": "b"}))
    reasons = run(snap).pending["q"]
    assert reasons[0].code == "SharingDeclined", reasons
    assert (
        reasons[0].message
        == "not shared: next to r0 on n0 GPU 0 the predicted slowdown of it is 40%, over its tolerance 30%"
    )
    assert reasons[-1].code == "QueuePosition"
    said, left_out = said_reasons(run(snap).pending)  # the sharing reason among the reasons the loop compares
    assert said["q"][0].code == "SharingDeclined" and left_out == set()
    assert said == {jid: r for jid, r in specific_reasons(run(snap).pending) if r}
    snap.sharing = info({}, {"r0": "a", "q": "b"})
    assert "no predicted slowdown for it next to r0 on a100" in run(snap).pending["q"][0].message
    snap.sharing = SharingInfo(unavailable="no interference model at /x (caldera interference train)")
    assert run(snap).pending["q"][0].message == "not shared: no interference model at /x (caldera interference train)"


def test_match_window_places_the_best_pair_first_and_keep_order_respects_a_blocked_gang():
    r0 = shared(running("r0", {"n0": [0]}))
    q1, q2 = shared(job("q1", queued_since=1.0)), shared(job("q2", queued_since=2.0))
    table = {**pair("a", "b", 0.2, 0.2), **pair("a", "c", 0.05, 0.05)}  # q2 (c) gains more next to r0 (a)
    wl = {"r0": "a", "q1": "b", "q2": "c"}
    snap = full_cluster(r0, queued=[q1, q2], sharing=info(table, wl))
    assert [s.job_id for s in run(snap).starts] == ["q1"]  # queue order: the first job takes the only partner
    snap.sharing = info(table, wl, match_window=2)
    assert [s.job_id for s in run(snap).starts] == ["q2"]  # best pair first
    # a waiting 2-GPU gang queued before q1 and q2: with keep_order neither shares past it
    gang = job("g", gpu=2, queued_since=0.5)
    snap = full_cluster(r0, queued=[gang, q1, q2], sharing=info(table, wl, keep_order=True))
    assert run(snap).starts == []
    snap.sharing = info(table, wl)
    assert [s.job_id for s in run(snap).starts] == ["q1"]


def test_min_gain_asks_for_a_margin_over_the_prediction():
    r0 = shared(running("r0", {"n0": [0]}))
    table = pair("a", "b", 0.25, 0.25)  # gain 0.5
    for margin, started in ((0.4, ["q"]), (0.6, [])):
        snap = full_cluster(r0, queued=[shared(job("q"))], sharing=info(table, {"r0": "a", "q": "b"}, min_gain=margin))
        assert [s.job_id for s in run(snap).starts] == started, margin


def test_a_gang_shares_only_the_gpus_of_a_job_of_its_own_shape_and_every_rank_the_same_partner():
    table = {**pair("g2a", "g2b", 0.1, 0.15), **pair("g2a", "one", 0.0, 0.0)}
    gang = shared(running("gang", {"n0": [0, 1]}))
    q = shared(job("q", gpu=2))
    snap = snapshot([node("n0", gpus=2)], [q], [gang])
    snap.sharing = info(table, {"gang": "g2a", "q": "g2b"})
    d = run(snap)
    assert [(s.job_id, [(a.node, a.gpus) for a in s.allocations]) for s in d.starts] == [("q", [("n0", (0, 1))])]
    assert d.starts[0].note.startswith("shares n0 GPUs 0,1 with gang; predicted slowdown")
    assert not decision_errors(snap, d)
    # a one-GPU job never joins one GPU of the gang (its ranks would slow down unevenly), even naively
    one = shared(job("one"))
    snap.queued = [one]
    snap.sharing = info(table, {"gang": "g2a", "one": "one"})
    assert run(snap).starts == [] and run(snap, aware=False).starts == []
    # a gang whose GPUs hold different partners offers no place to another gang
    solo = shared(running("solo", {"n0": [1]}))
    snap = snapshot([node("n0", gpus=2)], [q], [gang, solo])
    snap.sharing = info(table, {"gang": "g2a", "solo": "g2a", "q": "g2b"}, max_jobs_per_gpu=3)
    assert run(snap, aware=False).starts == []
    # nor does a gang of another shape (4 GPUs for a 2-GPU job), nor one whose GPUs lack memory for it
    big = shared(running("big", {"n0": [0, 1, 2, 3]}))
    snap = snapshot([node("n0", gpus=4)], [q], [big])
    snap.sharing = info(table, {"big": "g2a", "q": "g2b"})
    assert run(snap, aware=False).starts == []
    heavy = shared(running("gang", {"n0": [0, 1]}), mem=70000)
    snap = snapshot([node("n0", gpus=2)], [q], [heavy])
    snap.sharing = info(table, {"gang": "g2a", "q": "g2b"})
    assert run(snap, aware=False).starts == []


def test_validation_refuses_a_shared_start_whose_gpus_hold_different_partners():
    """The invariant the loop and the simulator check before applying a start, whatever policy made it."""
    gang = shared(running("gang", {"n0": [0, 1]}))
    solo = shared(running("solo", {"n0": [2]}))
    q = shared(job("q", gpu=2))
    snap = snapshot([node("n0", gpus=4)], [q], [gang, solo])
    snap.sharing = info({}, {"gang": "g2a", "solo": "g2a", "q": "g2b"}, max_jobs_per_gpu=3)

    def start_on(*gpus: int) -> list[str]:
        d = Decisions(starts=[Start("q", (Allocation("n0", gpus, cpu=1.0, memory_mib=1024),))])
        return [p.kind for p in decision_errors(snap, d)]

    assert start_on(0, 1) == []  # both GPUs hold the gang alone
    assert start_on(1, 2) == ["start_shared_partners"]  # the gang on one, solo on the other
    assert start_on(0, 3) == ["start_shared_partners"]  # half shared, half alone
    assert start_on(3, 3) == ["start_gpus"]


def test_drain_for_blocked_keeps_partners_off_the_gpus_a_blocked_gang_needs():
    # n0: two lone jobs (2 to finish before a 2-GPU gang fits); n1: a pair and a lone job (3 to finish)
    lone = {k: shared(running(k, {n: [g]})) for k, n, g in (("r0", "n0", 0), ("r1", "n0", 1), ("r4", "n1", 1))}
    pair_ = [shared(running(k, {"n1": [0]}), mem=30000) for k in ("r2", "r3")]
    gang = job("g", gpu=2, queued_since=1.0)
    q = shared(job("q", queued_since=2.0))
    table = {**pair("r0", "q", 0.0, 0.0), **pair("r1", "q", 0.1, 0.1), **pair("r4", "q", 0.2, 0.2)}
    wl = {k: k for k in (*lone, "q")}
    snap = snapshot([node("n0", gpus=2), node("n1", gpus=2)], [gang, q], [*lone.values(), *pair_])
    snap.sharing = info(table, wl)
    assert [(s.job_id, s.allocations[0].node) for s in run(snap).starts] == [("q", "n0")]  # next to r0, gain 1.0
    # with the rule, n0 drains for the gang: q joins r4 on n1 instead, although it gains less there
    snap.sharing = info(table, wl, drain_for_blocked=True)
    d = run(snap)
    assert [(s.job_id, s.allocations[0].node, s.allocations[0].gpus) for s in d.starts] == [("q", "n1", (1,))]
    assert not decision_errors(snap, d)
    # no exclusive job waiting: nothing to drain for, q takes the best GPU again
    snap.queued = [q]
    assert [s.allocations[0].node for s in run(snap).starts] == ["n0"]


def test_pair_on_free_opens_an_idle_gpu_outside_the_blocked_gangs_to_the_first_job_and_its_best_partner():
    # each node: an exclusive job on GPU 0, GPU 1 free; the 2-GPU gang at FIFO's head waits for n0 (ties: node order)
    busy = [running("x0", {"n0": [0]}), running("x1", {"n1": [0]})]
    gang = job("g", gpu=2, queued_since=1.0)
    q1, q2, q3 = (shared(job(k, queued_since=t)) for k, t in (("q1", 2.0), ("q2", 3.0), ("q3", 4.0)))
    table = {**pair("a", "b", 0.3, 0.3), **pair("a", "c", 0.1, 0.1), **pair("b", "c", 0.4, 0.5)}
    wl = {"q1": "a", "q2": "b", "q3": "c"}
    snap = snapshot([node("n0", gpus=2), node("n1", gpus=2)], [gang, q1, q2, q3], busy)
    snap.sharing = info(table, wl, drain_for_blocked=True)
    assert run(snap).starts == []  # FIFO holds both free GPUs behind the gang
    snap.sharing = info(table, wl, drain_for_blocked=True, pair_on_free=True, prefer_gain=0.6)
    d = run(snap)
    # q1 (the earliest) on n1's free GPU with q3, its best partner; n0's free GPU stays free for the gang
    assert sorted((s.job_id, s.allocations[0].node, s.allocations[0].gpus) for s in d.starts) == [
        ("q1", "n1", (1,)),
        ("q3", "n1", (1,)),
    ]
    assert not decision_errors(snap, d)
    assert next(s.note for s in d.starts if s.job_id == "q3").startswith("shares n1 GPU 1 with q1; predicted")
    # a job never opens a free GPU alone: with no partner within its tolerance, nobody starts
    snap.sharing = info(table, wl, drain_for_blocked=True, pair_on_free=True, prefer_gain=0.6, default_tolerance=0.05)
    assert run(snap).starts == []


def test_pair_on_free_never_opens_the_gpu_of_a_start_that_stayed_where_the_inner_policy_put_it():
    """A shareable job FIFO starts on a free GPU (movable with prefer_gain) that finds no partner stays there: that
    GPU is not free for a pair (it once got two more jobs, three on a GPU that takes two)."""
    busy = [running("x0", {"n0": [0]}), running("x1", {"n1": [0]})]
    m = shared(job("m", queued_since=0.5))
    gang = job("g", gpu=2, queued_since=1.0)
    q1, q3 = (shared(job(k, queued_since=t)) for k, t in (("q1", 2.0), ("q3", 4.0)))
    table = {**pair("a", "c", 0.1, 0.1), **pair("a", "m", 0.1, 0.1), **pair("c", "m", 0.1, 0.1)}
    snap = snapshot([node("n0", gpus=2), node("n1", gpus=2)], [m, gang, q1, q3], busy)
    snap.sharing = info(
        table, {"q1": "a", "q3": "c", "m": "m"}, drain_for_blocked=True, pair_on_free=True, prefer_gain=0.6
    )
    d = run(snap)
    [(where, gpus)] = [(s.allocations[0].node, s.allocations[0].gpus) for s in d.starts if s.job_id == "m"]
    assert not decision_errors(snap, d)
    on_m_gpu = [s.job_id for s in d.starts if (s.allocations[0].node, s.allocations[0].gpus) == (where, gpus)]
    assert on_m_gpu == ["m"]


def test_the_live_loop_takes_the_sharing_rules_from_settings(tmp_path):
    """The loop's ``SharingInfo`` carries the CALDERA_SHARING_* rules (off unless set), even while no model is
    there to predict with (the jobs' why then says so)."""
    from caldera.config import Settings
    from caldera.interference.snapshot import LivePredictions

    snap = snapshot([node("n0", gpus=1)], [shared(job("q"))], [])
    off = LivePredictions(Settings(data_dir=tmp_path)).info(snap, {"q": None})
    assert off is not None and not (off.drain_for_blocked or off.pair_on_free) and off.match_window == 1
    settings = Settings(
        data_dir=tmp_path, sharing_drain_for_blocked=True, sharing_pair_on_free=True, sharing_match_window=50
    )
    on = LivePredictions(settings).info(snap, {"q": None})
    assert on is not None and on.drain_for_blocked and on.pair_on_free and on.match_window == 50
    assert "no interference model" in on.unavailable
    with pytest.raises(ValueError, match="PAIR_ON_FREE needs CALDERA_SHARING_DRAIN_FOR_BLOCKED"):
        Settings(data_dir=tmp_path, sharing_pair_on_free=True)  # it would do nothing: said, not ignored
