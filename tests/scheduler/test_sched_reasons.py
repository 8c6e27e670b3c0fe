"""Why pending: every waiting job has reasons; QueuePosition positions and estimates; the lazy reason objects."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle
import time

import pytest

from caldera.scheduler import reasons
from caldera.scheduler.caldera_policy import CalderaPolicy
from caldera.scheduler.fifo import FifoPolicy
from caldera.scheduler.snapshot import Reason
from tests.builders import NOW, check_decisions, job, nodes, running, snapshot


def test_codes_are_the_documented_strings():
    assert reasons.CODES == (
        "QueueCapability",
        "UserCap",
        "GangNoFit",
        "QueuePosition",
        "Reserved",
        "BackfillBlocked",
        "WaitingForPreemption",
        "BestEffortNoIdle",
        "NeverFits",
        "SharingDeclined",
    )


def test_queue_position_and_estimated_start():
    # one node, busy until NOW + 600; three queued 8-GPU jobs of 1000 s each
    run = [running("r", {"n0": range(8)}, started_at=NOW - 400, max_runtime_s=1000)]
    q = [job(f"j{i}", 8, queued_since=NOW - 50 + i, max_runtime_s=1000) for i in range(3)]
    d = CalderaPolicy(priority_preemption=False, starvation_threshold_s=None)(snapshot(nodes(1), q, run))
    for i in range(3):
        r = d.pending[f"j{i}"][-1]
        assert r.code == "QueuePosition"
        t = NOW + 600 + 1000 * i
        assert r.details == {"position": i + 1, "estimated_start": t}
        assert (
            r.message
            == f"position {i + 1} in the queue, estimated start at {time.strftime('%H:%M', time.localtime(t))}"
        )


def test_estimate_is_none_when_the_job_is_larger_than_the_cluster():
    d = CalderaPolicy()(snapshot(nodes(1), [job("huge", 8, replicas=2)]))
    assert [r.code for r in d.pending["huge"]] == ["NeverFits", "QueuePosition"]
    assert d.pending["huge"][-1].details["estimated_start"] is None
    assert d.pending["huge"][-1].message == "position 1 in the queue"


def test_every_queued_job_gets_reasons_and_positions_follow_the_order():
    ns = nodes(2)
    run = [running("r0", {"n0": range(8)}), running("r1", {"n1": range(6)})]
    q = [job(f"j{i}", 1 + i % 4, queued_since=NOW - 100 + i, user=f"u{i % 3}") for i in range(40)]
    snap = snapshot(ns, q, run)
    d = CalderaPolicy()(snap)
    check_decisions(snap, d)
    positions = sorted(v[-1].details["position"] for v in d.pending.values())
    assert positions == list(range(1, len(d.pending) + 1))


def test_large_queues_use_lazy_reasons_that_behave_like_reasons():
    n = 3000  # above the size where reasons are built lazily
    q = [job(f"j{i:05d}", 8, queued_since=NOW - n + i) for i in range(n)]
    snap = snapshot(nodes(1), q, [running("r", {"n0": range(8)}, max_runtime_s=3600, started_at=NOW)])
    d = FifoPolicy()(snap)
    check_decisions(snap, d)
    r = d.pending["j00002"][-1]
    assert isinstance(r, Reason) and r.code == "QueuePosition"
    assert r.details["position"] == 3 and r.details["blocked_by"] == "j00000"
    assert r.details["estimated_start"] == NOW + 3 * 3600
    plain = Reason(r.code, r.message, r.details)
    assert r == plain and plain == r
    assert pickle.loads(pickle.dumps(r)) == plain and type(pickle.loads(pickle.dumps(r))) is Reason
    assert copy.deepcopy(r) == plain
    assert dataclasses.asdict(r) == {"code": r.code, "message": r.message, "details": r.details}
    assert repr(r).startswith("Reason(code='QueuePosition'")
    json.dumps({k: [dataclasses.asdict(x) for x in v] for k, v in d.pending.items()})
    assert d.pending["j02999"][-1].details["position"] == n
    assert d.pending["j00000"][0].code == "GangNoFit"


def test_pending_is_a_mapping_made_as_it_is_read():
    q = [
        job(f"j{i:04d}", 1 + i % 8, queued_since=NOW - 400 + i, user=f"u{i % 7}", max_runtime_s=600 * (i % 3))
        for i in range(300)
    ]
    run = [
        running("r", {"n0": range(8)}, started_at=NOW, max_runtime_s=600),
        running("be", {"n1": range(4)}, priority="best-effort"),
    ]
    snap = snapshot(nodes(4), q, run)
    d = CalderaPolicy()(snap)
    started = {s.job_id for s in d.starts}
    assert started and len(d.pending) == 300 - len(started)
    assert list(d.pending) == [j.id for j in q if j.id not in started]  # the snapshot's order
    assert all(jid not in d.pending for jid in started) and "nope" not in d.pending
    with pytest.raises(KeyError):
        d.pending[next(iter(started))]
    first = d.pending["j0299"]
    assert d.pending["j0299"] is first  # made once
    plain = {k: list(v) for k, v in d.pending.items()}
    assert d.pending == plain and dict(d.pending) == plain
    positions = sorted(v[-1].details["position"] for v in plain.values())
    assert positions == list(range(1, len(plain) + 1))  # every position once
    assert all(v[-1].code == "QueuePosition" for v in plain.values())
    # a second cycle over the same snapshot decides the same and explains the same
    again = CalderaPolicy()(snap)
    assert {k: [(r.code, r.message, r.details) for r in v] for k, v in again.pending.items()} == {
        k: [(r.code, r.message, r.details) for r in v] for k, v in plain.items()
    }


def test_said_reasons_are_the_specific_reasons_of_the_jobs_that_have_some():
    """``said_reasons``: what ``specific_reasons`` gives for the jobs with a reason besides their place, and the
    jobs that start; no other job of a long queue (deep ones have only their place)."""
    n = 600
    q = [job(f"j{i:04d}", 1 + i % 8, queued_since=NOW - 400 + i, user=f"u{i % 7}") for i in range(n)]
    d = CalderaPolicy()(snapshot(nodes(2), q, [running("r", {"n0": range(8)}, started_at=NOW, max_runtime_s=600)]))
    said, left_out = reasons.said_reasons(d.pending)
    every = dict(reasons.specific_reasons(d.pending))
    assert left_out == {s.job_id for s in d.starts} and left_out
    assert said == {jid: r for jid, r in every.items() if r}
    assert 0 < len(said) < len(every) - 100  # the jobs deep in the queue say nothing but their place
    assert reasons.said_reasons({"j0000": []}) is None  # a plain mapping cannot tell


def test_reasons_for_jobs_deep_in_a_long_queue_are_cheap_but_present():
    n = 5000
    q = [job(f"j{i:05d}", 8, queued_since=NOW - 100 + i / n) for i in range(n)]
    d = CalderaPolicy()(snapshot(nodes(1), q, [running("r", {"n0": range(8)}, priority="high")]))
    assert len(d.pending) == n
    assert d.pending["j00000"][0].code == "GangNoFit"  # near the head: explained
    assert [r.code for r in d.pending["j04999"]] == ["QueuePosition"]
