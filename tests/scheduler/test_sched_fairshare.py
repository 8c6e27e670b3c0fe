"""Usage decay and charging, and fair-share ordering within a priority class."""

from __future__ import annotations

import math

import pytest

from caldera.core.tenancy import QueueConfig
from caldera.scheduler import fairshare
from caldera.scheduler.caldera_policy import CalderaPolicy
from tests.builders import NOW, job, nodes, running, snapshot


def test_decay_halves_usage_every_half_life():
    u = {"alice": 100.0, "bob": 8.0}
    assert fairshare.decay(u, 3600, 3600) == {"alice": 50.0, "bob": 4.0}
    assert fairshare.decay(u, 7200, 3600) == {"alice": 25.0, "bob": 2.0}
    assert fairshare.decay(u, 0, 3600) == u
    assert fairshare.decay(u, 100, None) == u and fairshare.decay(u, 100, math.inf) == u
    assert fairshare.decay({"tiny": 1e-300}, 1e6, 1.0) == {"tiny": 0.0}  # keys are kept


def test_charge_adds_gpu_seconds_by_user_or_queue():
    run = [
        running("a", {"n0": [0, 1]}, user="alice", queue="q1"),
        running("b", {"n0": [2]}, user="bob", queue="q1"),
        running("c", {"n0": [3]}, user="alice", queue="q2", terminating=True),
    ]
    assert fairshare.charge({"alice": 1.0}, run, 10) == {"alice": 31.0, "bob": 10.0}
    assert fairshare.charge({}, run, 10, by="queue") == {"q1": 30.0, "q2": 10.0}
    with pytest.raises(ValueError):
        fairshare.charge({}, run, 10, by="account")


def test_advance_integrates_the_decay_exactly():
    run = [running("a", {"n0": [0]}, user="alice", queue="q")]
    users, queues = fairshare.advance({"alice": 100.0}, {}, run, 3600, 3600)
    # 100 halves to 50; one GPU over one half-life adds h / ln 2 * (1 - 1/2)
    assert users["alice"] == pytest.approx(50 + 3600 / math.log(2) / 2)
    assert queues["q"] == pytest.approx(3600 / math.log(2) / 2)
    users, _ = fairshare.advance({}, {}, run, 1.0, 7 * 86400)
    assert users["alice"] == pytest.approx(1.0, rel=1e-5)


def _one_free_gpu():
    return nodes(1), [running("busy", {"n0": range(7)}, priority="high")]


def test_user_with_less_recent_usage_goes_first():
    ns, run = _one_free_gpu()
    q = [
        job("heavy-job", 1, user="heavy", queued_since=NOW - 50),
        job("light-job", 1, user="light", queued_since=NOW - 10),
    ]
    d = CalderaPolicy()(snapshot(ns, q, run, user_usage={"heavy": 1e6, "light": 10.0}))
    assert [s.job_id for s in d.starts] == ["light-job"]
    assert d.pending["heavy-job"][-1].details["position"] == 1


def test_decay_lets_a_former_heavy_user_back_in():
    ns, run = _one_free_gpu()
    q = [
        job("heavy-job", 1, user="heavy", queued_since=NOW - 50),
        job("light-job", 1, user="light", queued_since=NOW - 10),
    ]
    usage = {"heavy": 1e6, "light": 1e5}
    d = CalderaPolicy()(snapshot(ns, q, run, user_usage=usage))
    assert [s.job_id for s in d.starts] == ["light-job"]
    # the light user keeps running for 20 half-lives at 1 GPU; the heavy user's usage decays to ~1
    users, _ = fairshare.advance(usage, {}, [running("l", {"n0": [7]}, user="light")], 20 * 3600, 3600)
    assert users["heavy"] < users["light"]
    d = CalderaPolicy()(snapshot(ns, q, run, user_usage=users))
    assert [s.job_id for s in d.starts] == ["heavy-job"]


def test_ties_go_by_queued_since():
    ns, run = _one_free_gpu()
    q = [job("later", 1, user="b", queued_since=NOW - 10), job("earlier", 1, user="a", queued_since=NOW - 20)]
    d = CalderaPolicy()(snapshot(ns, q, run))
    assert [s.job_id for s in d.starts] == ["earlier"]


def test_queue_usage_relative_to_weight():
    ns, run = _one_free_gpu()
    queues = [QueueConfig(name="big", account="a", weight=3.0), QueueConfig(name="small", account="b", weight=1.0)]
    q = [
        job("s", 1, queue="small", user="u1", queued_since=NOW - 50),
        job("b", 1, queue="big", user="u2", queued_since=NOW - 10),
    ]
    # big used 30 with 3/4 of the weight (ratio 0.8); small used 20 with 1/4 (ratio 1.6): big goes first
    d = CalderaPolicy()(snapshot(ns, q, run, queues, queue_usage={"big": 30.0, "small": 20.0}))
    assert [s.job_id for s in d.starts] == ["b"]
    fs = fairshare.FairShare({x.name: x for x in queues}, {"big": 30.0, "small": 20.0}, {}, ["big", "small"], [])
    assert fs.queue_factor("big") == pytest.approx(0.8) and fs.queue_factor("small") == pytest.approx(1.6)
    assert fs.factor("big", "x") > fs.factor("small", "x")


def test_priority_class_comes_before_fair_share():
    ns, run = _one_free_gpu()
    q = [
        job("light-normal", 1, user="light", queued_since=NOW - 50),
        job("heavy-high", 1, user="heavy", priority="high", queued_since=NOW - 10),
    ]
    d = CalderaPolicy()(snapshot(ns, q, run, user_usage={"heavy": 1e9}))
    assert [s.job_id for s in d.starts] == ["heavy-high"]


def test_fair_share_can_be_turned_off():
    ns, run = _one_free_gpu()
    q = [
        job("heavy-job", 1, user="heavy", queued_since=NOW - 50),
        job("light-job", 1, user="light", queued_since=NOW - 10),
    ]
    d = CalderaPolicy(fair_share=False)(snapshot(ns, q, run, user_usage={"heavy": 1e6}))
    assert [s.job_id for s in d.starts] == ["heavy-job"]


def test_scores_do_not_depend_on_the_order_of_the_active_names():
    """The totals are exact sums: a plain sum over a set of names rounded differently from one process to the next
    (string hashing differs per process), so a replay's schedule did too. 1e16 + 1 + 1 loses both ones in float
    arithmetic; 1 + 1 + 1e16 keeps them."""
    usage = {"big": 1e16, "a": 1.0, "b": 1.0}
    one = fairshare.FairShare({}, {}, usage, [], ["big", "a", "b"])
    other = fairshare.FairShare({}, {}, usage, [], ["a", "b", "big"])
    assert one.total_user == other.total_user == 1e16 + 2
    assert one.score("q", "a") == other.score("q", "a")
