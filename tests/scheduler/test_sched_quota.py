"""Queue quotas (validation, capability) and per-user caps."""

from __future__ import annotations

from caldera.core.resources import Resources
from caldera.core.tenancy import QueueConfig, Quota, UserCaps
from caldera.scheduler.caldera_policy import CalderaPolicy
from caldera.scheduler.quota import never_fits, validate_queues
from tests.builders import NOW, check_decisions, job, node, nodes, running, snapshot


def Q(name, quotas=None, caps=None, weight=1.0):
    return QueueConfig(name=name, account=name, weight=weight, quotas=quotas or {}, user_caps=caps or UserCaps())


CLUSTER = nodes(2, 8, "a100") + nodes(1, 4, "v100", prefix="v")  # 16 a100 + 4 v100, 192 CPUs


def test_valid_queues_give_no_errors():
    qs = [
        Q("a", {"gpu": Quota(guarantee=8, deserved=10, capability=16), "gpu/a100": Quota(guarantee=8)}),
        Q("b", {"gpu": Quota(guarantee=8), "gpu/v100": Quota(capability=4)}),
    ]
    assert validate_queues(qs, CLUSTER) == []


def test_guarantees_above_cluster_capacity():
    errs = validate_queues(
        [Q("a", {"gpu/a100": Quota(guarantee=10)}), Q("b", {"gpu/a100": Quota(guarantee=8)})], CLUSTER
    )
    assert len(errs) == 1
    assert "gpu/a100" in errs[0] and "18" in errs[0] and "16" in errs[0] and "a=10" in errs[0]


def test_capability_below_guarantee_and_deserved_above_capability():
    errs = validate_queues(
        [Q("a", {"gpu": Quota(guarantee=4, capability=2)}), Q("b", {"cpu": Quota(deserved=100, capability=50)})],
        CLUSTER,
    )
    assert any("queue a" in e and "capability for gpu (2) is below its guarantee (4)" in e for e in errs)
    assert any("queue b" in e and "deserved share for cpu (100) is above its capability (50)" in e for e in errs)


def test_unknown_gpu_model_and_duplicates():
    errs = validate_queues([Q("a", {"gpu/h100": Quota(capability=8)}), Q("a")], CLUSTER)
    assert any("no node has GPU model h100" in e and "a100, v100" in e for e in errs)
    assert any("defined twice" in e for e in errs)


def test_memory_guarantees_checked_in_mib():
    cluster = [node("n", 8, memory_mib=1000)]
    errs = validate_queues(
        [Q("a", {"memory": Quota(guarantee=800)}), Q("b", {"memory": Quota(guarantee=400)})], cluster
    )
    assert len(errs) == 1 and "memory" in errs[0] and "MiB" in errs[0]


def test_never_fits():
    assert never_fits(Resources(gpu=4), 2, CLUSTER) is None
    assert "largest node has 8" in never_fits(Resources(gpu=16), 1, CLUSTER)
    assert "no node has GPU model h100" in never_fits(Resources(gpu=1, gpu_model="h100"), 1, CLUSTER)
    assert "needs 24" in never_fits(Resources(gpu=8, gpu_model="a100"), 3, CLUSTER)
    assert "needs 8 v100 GPUs" in never_fits(Resources(gpu=8, gpu_model="v100"), 1, CLUSTER)
    assert "needs 20" in never_fits(Resources(gpu=4), 5, CLUSTER)  # no single model has 20
    assert "CPUs" in never_fits(Resources(gpu=1, cpu=500), 1, CLUSTER)
    assert "at most 2 fit" in never_fits(Resources(gpu=5), 3, CLUSTER)  # 5-GPU blocks: one per 8-GPU node
    assert never_fits(Resources(gpu=0, cpu=8), 10, CLUSTER) is None


def test_queue_capability_is_enforced_with_reason():
    queues = [Q("q", {"gpu/a100": Quota(capability=8)})]
    run = [running("r", {"n0": range(8)}, model="a100")]
    snap = snapshot(CLUSTER, [job("j", 1, model="a100")], run, queues)
    d = CalderaPolicy()(snap)
    check_decisions(snap, d)
    r = d.pending["j"][0]
    assert r.code == "QueueCapability"
    assert r.message == "queue at its capability for gpu/a100 (8 of 8 used)"
    assert {"resource": "gpu/a100", "used": 8, "limit": 8}.items() <= r.details.items()


def test_capability_counts_jobs_started_in_the_same_cycle():
    queues = [Q("q", {"gpu": Quota(capability=4)})]
    snap = snapshot(CLUSTER, [job(f"j{i}", 2, queued_since=NOW - 10 + i) for i in range(3)], [], queues)
    d = CalderaPolicy()(snap)
    assert [s.job_id for s in d.starts] == ["j0", "j1"]
    assert d.pending["j2"][0].code == "QueueCapability"
    assert d.pending["j2"][0].details["used"] == 4


def test_model_capability_steers_jobs_without_a_model():
    queues = [Q("q", {"gpu/a100": Quota(capability=0)})]
    snap = snapshot(CLUSTER, [job("any", 2)], [], queues)
    d = CalderaPolicy()(snap)
    assert {a.node for a in d.starts[0].allocations} == {"v0"}


def test_user_gpu_cap():
    queues = [Q("q", caps=UserCaps(max_gpus=4))]
    run = [running("r", {"n0": range(4)}, user="alice")]
    snap = snapshot(CLUSTER, [job("a1", 1, user="alice"), job("b1", 1, user="bob")], run, queues)
    d = CalderaPolicy()(snap)
    check_decisions(snap, d)
    assert [s.job_id for s in d.starts] == ["b1"]
    r = d.pending["a1"][0]
    assert r.code == "UserCap" and r.message == "user cap of 4 GPUs reached"
    assert r.details["cap"] == "max_gpus" and r.details["limit"] == 4 and r.details["used"] == 4


def test_user_gpu_cap_counts_this_cycle_and_partial_fit():
    queues = [Q("q", caps=UserCaps(max_gpus=4))]
    snap = snapshot(CLUSTER, [job("a", 3, queued_since=NOW - 20), job("b", 2, queued_since=NOW - 10)], [], queues)
    d = CalderaPolicy()(snap)
    assert [s.job_id for s in d.starts] == ["a"]
    r = d.pending["b"][0]
    assert r.code == "UserCap" and r.message.startswith("user cap of 4 GPUs reached")
    assert r.details["used"] == 3 and r.details["requested"] == 2


def test_user_interactive_and_running_caps():
    queues = [Q("q", caps=UserCaps(max_interactive_jobs=1, max_running_jobs=2))]
    run = [running("lab", {"n0": [0]}, user="alice", interactive=True)]
    snap = snapshot(
        CLUSTER,
        [
            job("nb", 1, user="alice", interactive=True, queued_since=NOW - 30),
            job("b1", 1, user="alice", queued_since=NOW - 20),
            job("b2", 1, user="alice", queued_since=NOW - 10),
        ],
        run,
        queues,
    )
    d = CalderaPolicy()(snap)
    check_decisions(snap, d)
    assert [s.job_id for s in d.starts] == ["b1"]
    assert d.pending["nb"][0].code == "UserCap"
    assert d.pending["nb"][0].message == "user cap of 1 interactive jobs reached"
    assert d.pending["nb"][0].details["cap"] == "max_interactive_jobs"
    assert d.pending["b2"][0].code == "UserCap"
    assert d.pending["b2"][0].message == "user cap of 2 running jobs reached"
    assert d.pending["b2"][0].details == {
        "cap": "max_running_jobs",
        "limit": 2,
        "used": 2,
        "queue": "q",
        "user": "alice",
    }


def test_queue_missing_from_snapshot_is_unlimited():
    run = [running(f"r{i}", {f"n{i}": range(8)}, queue="elsewhere") for i in range(2)]
    snap = snapshot(CLUSTER, [job("j", 4, queue="nowhere")], run, [Q("elsewhere", {"gpu": Quota(capability=4)})])
    d = CalderaPolicy()(snap)
    assert [s.job_id for s in d.starts] == ["j"]


def test_user_cap_blocks_only_the_user_at_it_whatever_the_queue_order():
    # bob's job came first: the up-front block of the groups at a cap looked at the last group's user (alice)
    # for every group, so bob's group was blocked by alice's usage; without fair share it raised NameError
    queues = [Q("q", caps=UserCaps(max_gpus=4))]
    run = [running("r", {"n0": range(4)}, user="alice")]
    for pol in (CalderaPolicy(), CalderaPolicy(fair_share=False)):
        snap = snapshot(
            CLUSTER,
            [job("b1", 1, user="bob", queued_since=NOW - 20), job("a1", 1, user="alice", queued_since=NOW - 10)],
            run,
            queues,
        )
        d = pol(snap)
        check_decisions(snap, d)
        assert [s.job_id for s in d.starts] == ["b1"]
        assert d.pending["a1"][0].code == "UserCap"
