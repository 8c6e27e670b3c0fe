"""Gang placement: all or nothing, packing, best fit, GPU models, and the index under the policies."""

from __future__ import annotations

from caldera.core.cluster import Allocation, Device, Node
from caldera.core.resources import Resources
from caldera.scheduler.caldera_policy import CalderaPolicy
from caldera.scheduler.placement import ClusterIndex, free_capacity, place_gang
from tests.builders import NOW, check_decisions, job, node, nodes, running, snapshot


def _gpus_on(d, job_id):
    st = next(s for s in d.starts if s.job_id == job_id)
    return {(a.node, g) for a in st.allocations for g in a.gpus}


def test_gang_is_all_or_nothing_with_partial_free_capacity():
    # 3 free GPUs on each of two nodes: a 2 x 4 gang cannot start, and nothing is held for it
    ns = nodes(2)
    run = [running("r0", {"n0": range(5)}), running("r1", {"n1": range(5)})]
    snap = snapshot(
        ns, [job("gang", 4, replicas=2, queued_since=NOW - 20), job("small", 3, queued_since=NOW - 10)], run
    )
    d = CalderaPolicy(priority_preemption=False, starvation_threshold_s=None)(snap)
    check_decisions(snap, d)
    assert [s.job_id for s in d.starts] == ["small"]  # the free GPUs were not kept for the gang
    r = d.pending["gang"][0]
    assert r.code == "GangNoFit"
    assert r.message == "gang needs 2 x 4 GPUs on one node each and the largest free block is 3"
    assert r.details["replicas"] == 2 and r.details["gpus_per_replica"] == 4
    assert r.details["largest_free_block"] == 3


def test_gang_no_fit_message_when_blocks_are_too_few():
    ns = nodes(3)
    run = [running("r0", {"n0": range(4)}), running("r1", {"n1": range(8)}), running("r2", {"n2": range(8)})]
    snap = snapshot(ns, [job("gang", 4, replicas=2)], run)
    d = CalderaPolicy(starvation_threshold_s=None, priority_preemption=False)(snap)
    r = d.pending["gang"][0]
    assert r.code == "GangNoFit"
    assert r.details["largest_free_block"] == 4 and r.details["fitting_replicas"] == 1


def test_one_gpu_job_goes_onto_the_most_used_node():
    ns = nodes(3)
    run = [running("r0", {"n0": range(2)}), running("r1", {"n1": range(7)}), running("r2", {"n2": range(5)})]
    snap = snapshot(ns, [job("one", 1)], run)
    d = CalderaPolicy()(snap)
    check_decisions(snap, d)
    assert _gpus_on(d, "one") == {("n1", 7)}


def test_four_gpu_job_takes_the_tightest_node_that_holds_it():
    ns = nodes(3)
    run = [running("r0", {"n0": range(4)}), running("r2", {"n2": range(2)})]  # free: 4, 8, 6
    snap = snapshot(ns, [job("four", 4)], run)
    d = CalderaPolicy()(snap)
    assert {n for n, _ in _gpus_on(d, "four")} == {"n0"}


def test_four_replica_job_is_packed_onto_one_node_not_spread():
    # free: n0 2, n1 2, n2 4, n3 8. Best fit per replica would spread 4 x 1 GPU over n0 and n1; packing puts all
    # four replicas on n2.
    ns = nodes(4)
    run = [running("r0", {"n0": range(6)}), running("r1", {"n1": range(6)}), running("r2", {"n2": range(4)})]
    snap = snapshot(ns, [job("dist", 1, replicas=4)], run)
    d = CalderaPolicy()(snap)
    check_decisions(snap, d)
    st = d.starts[0]
    assert {a.node for a in st.allocations} == {"n2"}
    assert sorted(g for a in st.allocations for g in a.gpus) == [4, 5, 6, 7]


def test_big_gang_uses_as_few_nodes_as_possible():
    ns = nodes(4)
    run = [running("r0", {"n0": range(4)}), running("r1", {"n1": range(4)})]  # free: 4, 4, 8, 8
    snap = snapshot(ns, [job("g", 4, replicas=4)], run)
    d = CalderaPolicy()(snap)
    assert sorted(a.node for a in d.starts[0].allocations) == ["n2", "n2", "n3", "n3"]


def test_gpu_model_is_respected_and_a_gang_uses_one_model():
    ns = [node("a", 4, "a100"), node("v", 4, "v100")]
    run = [running("r", {"a": [0, 1]})]
    snap = snapshot(
        ns,
        [job("want-v", 2, model="v100", queued_since=NOW - 20), job("any", 2, replicas=2, queued_since=NOW - 10)],
        run,
    )
    d = CalderaPolicy(priority_preemption=False)(snap)
    check_decisions(snap, d)
    assert {n for n, _ in _gpus_on(d, "want-v")} == {"v"}
    assert d.pending["any"][0].code == "GangNoFit"  # 2 + 2 free GPUs, but of two models
    snap = snapshot(ns, [job("big", 2, replicas=3)])
    assert CalderaPolicy()(snap).pending["big"][0].code == "NeverFits"  # 6 > 4 GPUs of any one model


def test_cpu_and_memory_limit_replicas_per_node():
    ns = [node("n0", 8, cpu=16)]
    snap = snapshot(ns, [job("cpuheavy", 1, replicas=3, cpu=8)])
    d = CalderaPolicy()(snap)
    assert d.pending["cpuheavy"][0].code == "GangNoFit"
    snap = snapshot(ns, [job("ok", 1, replicas=2, cpu=8)])
    assert [s.job_id for s in CalderaPolicy()(snap).starts] == ["ok"]


def test_cpu_only_jobs_prefer_nodes_without_free_gpus():
    ns = nodes(2)
    run = [running("r0", {"n1": range(8)})]
    snap = snapshot(ns, [job("cpu", 0, cpu=4)], run)
    d = CalderaPolicy()(snap)
    assert d.starts[0].allocations[0].node == "n1" and d.starts[0].allocations[0].gpus == ()


def test_unschedulable_nodes_and_odd_device_indices():
    ns = [Node("odd", 16, 65536, (Device(3, "a100"), Device(5, "a100"))), node("off", 8, schedulable=False)]
    idx = ClusterIndex(ns, [running("r", {"odd": [5]})])
    assert idx.total_free_gpus == 1 and idx.names == ["odd"]
    plan = idx.place(1, None, 1.0, 1024, 1)
    assert idx.commit(plan, 1, 1.0, 1024) == (Allocation("odd", (3,), 1.0, 1024),)
    assert idx.place(1, None, 1.0, 1024, 1) is None


def test_index_release_restore_and_hold():
    idx = ClusterIndex(nodes(1), [running("r", {"n0": range(8)})])
    assert idx.max_block() == 0
    saved = idx.save([0])
    idx.release([Allocation("n0", (0, 1), 1.0, 1024)], trial=True)
    assert idx.max_block() == 2 and idx.place(2, None, 1.0, 1024, 1) is not None
    idx.restore(saved)
    assert idx.max_block() == 0 and idx.total_free_gpus == 0


def test_simple_api_packs_too():
    ns = nodes(3)
    free = free_capacity(ns, [running("r0", {"n0": range(6)}), running("r1", {"n1": range(4)})])
    allocs = place_gang(free, Resources(gpu=1), 4)
    assert {a.node for a in allocs} == {"n1"}
    assert place_gang(free, Resources(gpu=8), 2) is None
    assert len(free["n2"].free_gpus) == 8  # a failed gang changed nothing


def test_a_job_with_speeds_goes_to_the_fastest_model_where_it_fits():
    """A 4-GPU job that names no model: speed-blind (the default), the half-used K80 node is the best fit; with
    ``speed_placement``, the V100 node (3x faster for it) unless no V100 fits, then the K80s."""
    ns = nodes(1, 8, "k80", prefix="k") + nodes(1, 8, "v100", prefix="v")
    run = [running("r", {"k0": range(4)})]
    fast = job("fast", 4)
    d = CalderaPolicy(starvation_threshold_s=None)(snapshot(ns, [job("blind", 4)], run))
    assert {n for n, _ in _gpus_on(d, "blind")} == {"k0"}
    fast.speeds = {"v100": 1.0, "k80": 0.33}
    snap = snapshot(ns, [fast], run)
    assert {n for n, _ in _gpus_on(CalderaPolicy(starvation_threshold_s=None)(snap), "fast")} == {"k0"}  # default
    d = CalderaPolicy(starvation_threshold_s=None, speed_placement=True)(snap)
    check_decisions(snap, d)
    assert {n for n, _ in _gpus_on(d, "fast")} == {"v0"}
    busy = [*run, running("v", {"v0": range(6)})]
    d = CalderaPolicy(starvation_threshold_s=None, speed_placement=True)(snapshot(ns, [fast], busy))
    assert {n for n, _ in _gpus_on(d, "fast")} == {"k0"}
    idx = ClusterIndex(ns, run)
    assert idx.place(4, None, 1.0, 1024, 1, speeds={"k80": 2.0, "v100": 1.0})[0] == "k80"
    assert idx.place(4, None, 1.0, 1024, 1, speeds={"v100": 1.0})[0] == "k80"  # a model not named: 1; tie -> fit
