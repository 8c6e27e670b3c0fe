"""Helpers shared by the policies: sorting large queues cheaply, and pausing the garbage collector for a cycle."""

from __future__ import annotations

import gc
from collections.abc import Sequence
from operator import attrgetter

import numpy as np

from caldera.scheduler.job import SchedJob

_QS = attrgetter("queued_since")
_GPU = attrgetter("request.gpu")


class gc_paused:
    """Pause the cyclic garbage collector for one scheduling cycle.

    A cycle over 100,000 queued jobs allocates a few hundred thousand small objects; with the collector on, its
    generation-2 passes over the (large, long-lived) snapshot can double the cycle time. Nothing a cycle allocates
    forms reference cycles worth collecting early; the previous state is restored on exit.
    """

    __slots__ = ("was",)

    def __enter__(self) -> gc_paused:
        self.was = gc.isenabled()
        gc.disable()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.was:
            gc.enable()


def queued_since(jobs: Sequence[SchedJob], unset: list[int] | None = None) -> np.ndarray:
    """``queued_since`` of each job (``submitted_at`` when unset, and then its index added to ``unset`` when
    given), as float64."""
    n = len(jobs)
    try:
        qs = np.fromiter(map(_QS, jobs), dtype=np.float64, count=n)  # NumPy 2 reads None as NaN
    except TypeError:  # older NumPy refuses None
        qs = np.array(list(map(_QS, jobs)), dtype=np.float64)
    for i in np.flatnonzero(np.isnan(qs)).tolist():
        qs[i] = jobs[i].submitted_at
        if unset is not None:
            unset.append(i)
    return qs


def gpus_per_replica(jobs: Sequence[SchedJob]) -> np.ndarray:
    return np.fromiter(map(_GPU, jobs), dtype=np.int64, count=len(jobs))


def sort_order(jobs: Sequence[SchedJob], qs: np.ndarray, major: np.ndarray | None = None) -> np.ndarray:
    """Indices of ``jobs`` sorted by (``major``, ``qs``, job id), ascending. ``major`` and ``qs`` are per job.

    When ``qs`` is already strictly increasing (jobs listed in queueing order, the usual case) a stable sort on
    ``major`` alone gives the same order, and a radix sort when ``major`` is small."""
    n = len(jobs)
    if n == 0:
        return np.zeros(0, dtype=np.intp)
    if n > 1 and bool((qs[1:] > qs[:-1]).all()):
        if major is None:
            return np.arange(n, dtype=np.intp)
        lo, hi = int(major.min()), int(major.max())
        if hi < 32768 and lo >= 0:
            return np.argsort(major.astype(np.int16), kind="stable")
        if lo >= 0 and hi < (2**62) // n:
            # the key made unique by the index: sorting values (vectorised) is several times faster than a stable
            # argsort (100,000 jobs: 1.4 against 8.2 ms) and gives the same order
            return (np.sort(major.astype(np.int64) * n + np.arange(n, dtype=np.int64)) % n).astype(np.intp)
        return np.argsort(major, kind="stable")
    if major is None:
        idx = np.argsort(qs, kind="stable")
    else:
        idx = np.lexsort((qs, major))
    if n > 1:
        sq = qs[idx]
        eq = sq[1:] == sq[:-1]
        if major is not None:
            sm = major[idx]
            eq &= sm[1:] == sm[:-1]
        if eq.any():
            idx = idx.copy()
            ties = np.flatnonzero(eq).tolist()
            k = 0
            while k < len(ties):
                a = ties[k]
                b = a
                while k + 1 < len(ties) and ties[k + 1] == b + 1:
                    k += 1
                    b = ties[k]
                run = idx[a : b + 2].tolist()
                run.sort(key=lambda j: jobs[j].id)
                idx[a : b + 2] = run
                k += 1
    return idx
