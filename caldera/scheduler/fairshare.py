"""Fair share with usage decay (Slurm-multifactor-like).

Usage is kept as *decayed GPU-seconds* per user and per queue (``Snapshot.user_usage`` and
``Snapshot.queue_usage``). Each cycle the live loop and the simulator age the stored values with :func:`decay` and
add what ran since the last cycle with :func:`charge` (or do both at once, exactly, with :func:`advance`).

Ordering (within one priority class) uses :class:`FairShare`: for a job's queue and user,

    score = queue_usage[q] / total_queue_usage / (weight[q] / total_weight)
          + user_usage[u]  / total_user_usage  * active_users

over the queues and users that have queued or running jobs. Each term is "fraction of the recent usage over
fraction of the share" (1 means exactly at its share; users share equally). Lower scores go first; ties by
``queued_since``. A queue or user that used little recently relative to its share therefore goes first, and as its
usage decays (halving every half-life) an old heavy user regains priority.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from caldera.core.tenancy import QueueConfig
from caldera.scheduler.snapshot import SchedJob

LN2 = math.log(2.0)


def decay_factor(elapsed_s: float, half_life_s: float | None) -> float:
    if elapsed_s <= 0 or half_life_s is None or half_life_s <= 0 or math.isinf(half_life_s):
        return 1.0
    return 0.5 ** (elapsed_s / half_life_s)


def decay(usage: Mapping[str, float], elapsed_s: float, half_life_s: float | None) -> dict[str, float]:
    """``usage`` aged by ``elapsed_s``: every value multiplied by ``0.5 ** (elapsed_s / half_life_s)``. Keys are
    kept (even tiny values), so a caller that writes the result back updates every row it read. No decay when the
    half-life is None, zero, negative or infinite."""
    f = decay_factor(elapsed_s, half_life_s)
    if f == 1.0:
        return dict(usage)
    return {k: v * f for k, v in usage.items()}


def _gpus_by(running: Iterable[SchedJob], by: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for job in running:
        g = job.request.gpu * job.replicas
        if g:
            k = job.user if by == "user" else job.queue
            out[k] = out.get(k, 0.0) + g
    return out


def charge(
    usage: Mapping[str, float], running: Iterable[SchedJob], elapsed_s: float, by: str = "user"
) -> dict[str, float]:
    """``usage`` plus ``gpus * elapsed_s`` for each running job (terminating ones too: they still hold their GPUs),
    keyed by ``job.user`` (``by="user"``) or ``job.queue`` (``by="queue"``)."""
    if by not in ("user", "queue"):
        raise ValueError("by must be 'user' or 'queue'")
    out = dict(usage)
    if elapsed_s <= 0:
        return out
    for k, g in _gpus_by(running, by).items():
        out[k] = out.get(k, 0.0) + g * elapsed_s
    return out


def advance(
    user_usage: Mapping[str, float],
    queue_usage: Mapping[str, float],
    running: Iterable[SchedJob],
    elapsed_s: float,
    half_life_s: float | None,
) -> tuple[dict[str, float], dict[str, float]]:
    """Decay both usage maps over ``elapsed_s`` and charge the running jobs for that interval, integrating the decay
    exactly: a job holding g GPUs over the interval adds ``g * h/ln2 * (1 - 2**(-elapsed/h))`` (about
    ``g * elapsed`` when the interval is short next to the half-life ``h``)."""
    running = list(running)
    f = decay_factor(elapsed_s, half_life_s)
    if f == 1.0:
        w = max(elapsed_s, 0.0)
    else:
        w = half_life_s / LN2 * (1.0 - f)  # type: ignore[operator]
    out = []
    for usage, by in ((user_usage, "user"), (queue_usage, "queue")):
        d = decay(usage, elapsed_s, half_life_s)
        if w > 0:
            for k, g in _gpus_by(running, by).items():
                d[k] = d.get(k, 0.0) + g * w
        out.append(d)
    return out[0], out[1]


class FairShare:
    """Fair-share scores of (queue, user) pairs for one cycle (see the module docstring)."""

    def __init__(
        self,
        queues: Mapping[str, QueueConfig],
        queue_usage: Mapping[str, float],
        user_usage: Mapping[str, float],
        active_queues: Iterable[str],
        active_users: Iterable[str],
    ) -> None:
        self.queue_usage = queue_usage
        self.user_usage = user_usage
        aq = set(active_queues)
        au = set(active_users)
        self.weights = {q: (queues[q].weight if q in queues else 1.0) for q in aq}
        # fsum: the exact sum, whatever order the sets give (a plain sum over a set of names rounded differently
        # from one process to the next, with Python's per-process string hashing, and a replay's schedule with it)
        self.total_weight = math.fsum(self.weights.values()) or 1.0
        self.total_queue = math.fsum(max(queue_usage.get(q, 0.0), 0.0) for q in aq)
        self.total_user = math.fsum(max(user_usage.get(u, 0.0), 0.0) for u in au)
        self.n_users = max(len(au), 1)

    def queue_factor(self, queue: str) -> float:
        if self.total_queue <= 0:
            return 0.0
        w = self.weights.get(queue, 1.0) / self.total_weight
        return max(self.queue_usage.get(queue, 0.0), 0.0) / self.total_queue / w

    def user_factor(self, user: str) -> float:
        if self.total_user <= 0:
            return 0.0
        return max(self.user_usage.get(user, 0.0), 0.0) / self.total_user * self.n_users

    def score(self, queue: str, user: str) -> float:
        """Lower goes first."""
        return self.queue_factor(queue) + self.user_factor(user)

    def factor(self, queue: str, user: str) -> float:
        """The score as a Slurm-like factor in (0, 1]: 1 for no recent usage, 0.5 when exactly at its shares."""
        return 2.0 ** (-self.score(queue, user) / 2.0)
