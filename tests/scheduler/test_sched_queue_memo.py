"""The queued jobs' features kept between cycles (``Snapshot.queue_memo``): a cycle reads only the jobs that joined
the queue (at its end, or in its middle where ``Snapshot.queue_changes`` says so), takes out those that left, and
decides what it decides without the memo."""

from __future__ import annotations

import random

import numpy as np

from caldera.core.tenancy import PriorityClass
from caldera.scheduler.queue_memo import QueueChanges, QueueMemo
from caldera.scheduler.registry import get_policy
from tests.builders import NOW, job, nodes, snapshot

CLASSES = (PriorityClass.HIGH, PriorityClass.NORMAL, PriorityClass.NORMAL, PriorityClass.LOW, PriorityClass.BEST_EFFORT)


def _jobs(rnd: random.Random, first: int, count: int, t: float) -> list:
    out = []
    for i in range(first, first + count):
        j = job(
            f"j{i:04d}",
            rnd.choice((0, 1, 1, 2, 4, 8)),
            replicas=rnd.choice((1, 1, 2)),
            user=f"u{rnd.randrange(5)}",
            queue=rnd.choice(("a", "b")),
            priority=rnd.choice(CLASSES),
            queued_since=t - rnd.uniform(0, 3600),
            interactive=rnd.random() < 0.1,
            attained_gpu_s=rnd.choice((0.0, 0.0, rnd.uniform(0, 50_000))),
        )
        if rnd.random() < 0.05:
            j.queued_since = None  # submitted_at stands in
        out.append(j)
    return out


def _same(a, b) -> None:
    for name in ("since", "per_replica", "attained", "replicas"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.unset == b.unset
    ga, gb = a.groups(), b.groups()
    assert np.array_equal(ga[0], gb[0]) and ga[1] == gb[1]


def test_the_memo_reads_only_the_jobs_that_joined_and_forgets_the_started_ones():
    rnd = random.Random(3)
    queued = _jobs(rnd, 0, 200, NOW)
    memo = QueueMemo()
    _same(memo.read(queued, True), QueueMemo().read(queued, True))
    started = [5, 17, 18, 120]
    memo.after_cycle(np.array(started), {})
    stays = [j for i, j in enumerate(queued) if i not in started]
    # a started job that ran, was preempted and is queued again is the same object, changed: read again
    back = queued[17]
    back.attained_gpu_s, back.queued_since = 77_777.0, NOW + 5
    nxt = stays + _jobs(rnd, 200, 30, NOW + 10) + [back]
    _same(memo.read(nxt, True), QueueMemo().read(nxt, True))
    # a job that stayed queued is not read again: changing it in place breaks the caller's contract, unseen
    stays[0].queued_since = NOW + 999
    memo.after_cycle(np.zeros(0, dtype=np.intp), {})
    assert memo.read(nxt, True).since[0] != NOW + 999
    # a queue that is not the previous one less its started jobs plus new ones is read whole
    shuffled = list(nxt)
    rnd.shuffle(shuffled)
    _same(memo.read(shuffled, True), QueueMemo().read(shuffled, True))


def _changed(rnd: random.Random, queue: list, first: int, t: float) -> tuple[list, QueueChanges]:
    """``queue`` with some jobs taken out of its middle, some put back in (new objects: a job re-queued, or
    released), some replaced in their place (a changed row) and some added at its end; and what changed."""
    left = sorted(rnd.sample(range(len(queue)), 6))
    nxt = [j for i, j in enumerate(queue) if i not in left]
    replaced = rnd.sample(range(len(nxt)), 2)
    for i in replaced:
        nxt[i] = job(nxt[i].id, 2, attained_gpu_s=rnd.uniform(1, 9000.0), queued_since=None)
    joined = sorted(rnd.sample(range(len(nxt) + 3), 3))
    for k, i in enumerate(joined):
        nxt.insert(i, _jobs(rnd, first + k, 1, t)[0])
    replaced_at = [i + sum(j <= i + n for n, j in enumerate(joined)) for i in sorted(replaced)]
    before = [j for i, j in enumerate(queue) if i not in left]
    old_at = [queue.index(before[i]) for i in replaced]
    nxt += _jobs(rnd, first + 3, 4, t)
    return nxt, QueueChanges(queue, sorted(left + old_at), sorted(joined + replaced_at))


def test_the_memo_takes_out_and_puts_in_the_jobs_it_is_told_of_and_reads_no_other():
    rnd = random.Random(5)
    queue = _jobs(rnd, 0, 300, NOW)
    memo = QueueMemo()
    memo.read(queue, True)
    first = 1000
    for cycle in range(8):
        started = np.array(sorted(rnd.sample(range(len(queue)), 2)))
        memo.after_cycle(started, {})
        stays = [j for i, j in enumerate(queue) if i not in set(started.tolist())]
        nxt, changes = _changed(rnd, stays, first, NOW + cycle)
        # told relative to the queue less the started jobs; the memo is told relative to the queue it read
        seen_at = [queue.index(stays[i]) for i in changes.left]
        told = QueueChanges(queue, seen_at, changes.joined)
        read = memo.jobs_read
        _same(memo.read(nxt, True, told), QueueMemo().read(nxt, True))
        assert memo.jobs_read - read == 3 + 2 + 4  # put in, replaced, added at the end: not the queue whole
        queue, first = nxt, first + 10


def test_a_wrong_word_on_the_changes_costs_a_read_of_the_queue_never_a_wrong_feature():
    rnd = random.Random(8)
    queue = _jobs(rnd, 0, 100, NOW)
    for wrong in ("a job still queued said to have left", "a job put in at the wrong place", "an old list"):
        memo = QueueMemo()
        memo.read(queue, True)
        nxt, changes = _changed(rnd, queue, 1000, NOW)
        if wrong == "an old list":
            changes = QueueChanges(list(queue), changes.left, changes.joined)
        elif wrong.startswith("a job still"):
            changes = QueueChanges(queue, sorted({*changes.left, 0, 1}), changes.joined)
        else:
            changes = QueueChanges(queue, changes.left, [i + 1 for i in changes.joined])
        read = memo.jobs_read
        _same(memo.read(nxt, True, changes), QueueMemo().read(nxt, True))
        assert memo.jobs_read - read >= len(nxt), wrong


def test_the_jobs_preempted_for_are_found_where_jobs_left_and_joined_before_them():
    rnd = random.Random(2)
    queue = _jobs(rnd, 0, 50, NOW)
    memo = QueueMemo()
    memo.read(queue, True)
    memo.after_cycle(np.array([3]), {queue[20].id: 20, queue[40].id: 40, queue[45].id: 45})
    nxt = queue[:3] + queue[4:10] + _jobs(rnd, 100, 2, NOW) + queue[10:30] + queue[31:45] + queue[46:]
    memo.read(nxt, True, QueueChanges(queue, [30, 45], [9, 10]))
    assert memo.jobs_read == 52  # the first read, and the two put in
    assert memo.find(nxt, [queue[40].id, queue[20].id]) == [nxt.index(queue[20]), nxt.index(queue[40])]
    assert memo.find(nxt, [queue[45].id]) is None  # it left


def test_cycles_with_a_memo_decide_as_cycles_without():
    rnd = random.Random(11)
    policy = get_policy("caldera")
    memo = QueueMemo()
    queued = _jobs(rnd, 0, 400, NOW)
    running: list = []
    t = NOW
    starts = preemptions = 0
    for cycle in range(6):
        with_memo = snapshot(nodes(4), queued, running, now=t)
        with_memo.queue_memo = memo
        d = policy(with_memo)
        e = policy(snapshot(nodes(4), queued, running, now=t))
        assert (d.starts, d.preemptions, d.wake_at) == (e.starts, e.preemptions, e.wake_at)
        assert {k: [r.code for r in v] for k, v in d.pending.items()} == {
            k: [r.code for r in v] for k, v in e.pending.items()
        }
        starts += len(d.starts)
        preemptions += len(d.preemptions)
        # apply the decisions as the simulator does, changing the job objects in place
        by_id = {j.id: j for j in queued}
        victims = {p.job_id for p in d.preemptions}
        requeued = []
        for j in running:
            j.attained_gpu_s += 4000.0 * j.gpus  # up the attained-service levels: victims for the arrivals
            if j.id in victims:  # stopped at once and queued again, the same object
                j.attained_gpu_s += 3600.0 * j.gpus
                j.started_at, j.allocations, j.queued_since = None, (), t
                requeued.append(j)
        running = [j for j in running if j.id not in victims]
        for s in d.starts:
            j = by_id.pop(s.job_id)
            j.started_at, j.allocations = t, s.allocations
            running.append(j)
        queued = list(by_id.values()) + _jobs(rnd, 400 + 20 * cycle, 20, t) + requeued
        t += 60.0
    assert starts and preemptions  # the cycles started and preempted jobs
