"""``sort_order``: the queue's order by (major key, queued_since, id) whatever path it takes (a small key, a large
one, ties in queued_since)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from caldera.scheduler.ordering import sort_order
from tests.builders import job


@pytest.mark.parametrize("key_range", [3, 30_000, 10**9, 2**61])
@pytest.mark.parametrize("ties", [False, True])
def test_sort_order_is_the_order_by_key_then_queued_since_then_id(key_range: int, ties: bool):
    rnd = random.Random(key_range + ties)
    n = 3000
    since = [float(rnd.randrange(50)) if ties else float(i) for i in range(n)]
    jobs = [job(f"j{rnd.randrange(10**6):07d}-{i}", queued_since=since[i]) for i in range(n)]
    major = np.array([rnd.randrange(key_range) for _ in range(n)], dtype=np.int64)
    expected = sorted(range(n), key=lambda i: (int(major[i]), since[i], jobs[i].id))
    assert sort_order(jobs, np.array(since), major).tolist() == expected
    assert sort_order(jobs, np.array(since)).tolist() == sorted(range(n), key=lambda i: (since[i], jobs[i].id))
