"""Admission in the ``caldera`` policy: each queue's quotas and usage in a cycle, user caps, queue capabilities,
and the reasons a job is held back by them. The per-cycle state every part of the policy shares starts here.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Set as AbstractSet

import numpy as np

from caldera.core.resources import CPU, GPU, MEMORY
from caldera.core.tenancy import QueueConfig
from caldera.scheduler.caldera_options import EPS, CalderaOptions
from caldera.scheduler.engine import CycleBase, Victim
from caldera.scheduler.quota import deserved
from caldera.scheduler.reasons import (
    QUEUE_CAPABILITY,
    USER_CAP,
    num,
)
from caldera.scheduler.snapshot import Reason, SchedJob, Snapshot


class _Queue:
    __slots__ = (
        "name",
        "cfg",
        "cap",
        "guar",
        "des",
        "max_gpus",
        "max_int",
        "max_run",
        "has_caps",
        "used",
        "used_nb",
        "chosen",
        "claimed",
        "rank_gpus",
        "groups",
        "gpu_keys_guar",
    )

    def __init__(self, name: str, cfg: QueueConfig | None) -> None:
        self.name = name
        self.cfg = cfg
        self.cap: dict[str, float] = {}
        self.guar: dict[str, float] = {}
        self.des: dict[str, float] = {}
        if cfg is not None:
            for key, qt in cfg.quotas.items():
                if qt.capability is not None:
                    self.cap[key] = float(qt.capability)
                if qt.guarantee > 0:
                    self.guar[key] = float(qt.guarantee)
                self.des[key] = float(deserved(qt))
            uc = cfg.user_caps
            self.max_gpus, self.max_int, self.max_run = uc.max_gpus, uc.max_interactive_jobs, uc.max_running_jobs
        else:
            self.max_gpus = self.max_int = self.max_run = None
        self.has_caps = self.max_gpus is not None or self.max_int is not None or self.max_run is not None
        self.gpu_keys_guar = [k for k in self.guar if k == GPU or k.startswith(GPU + "/")]
        self.used: dict[str, float] = {}  # everything running, for capability
        self.used_nb: dict[str, float] = {}  # GPUs of running jobs that are not best-effort nor terminating
        self.chosen: dict[str, float] = {}  # GPUs of its jobs preempted in this cycle
        self.claimed: dict[str, float] = {}  # GPUs of its jobs waiting for preemptions in this cycle
        self.rank_gpus = [0, 0, 0, 0]  # GPUs of preemptable running jobs by priority rank
        self.groups: list[int] = []

    def headroom_open(self) -> bool:
        for k in self.gpu_keys_guar:
            if self.guar[k] - self.used_nb.get(k, 0.0) - self.claimed.get(k, 0.0) >= 1 - EPS:
                return True
        return False

    def share_key(self, key: str) -> str:
        return key if key in self.des else GPU

    def over_share(self, key: str, taken: float, gpus: int) -> bool:
        """Above its deserved share on ``key`` (net of this cycle's victims and ``taken`` more), and still at or
        above its guarantee after losing ``gpus`` more."""
        k = self.share_key(key)
        used = self.used_nb.get(k, 0.0) - self.chosen.get(k, 0.0) - taken
        return used > self.des.get(k, 0.0) + EPS and used - gpus >= self.guar.get(k, 0.0) - EPS

    def keeps_guarantee(self, key: str, taken: float, gpus: int) -> bool:
        """Still at or above its guarantee on ``key`` after losing ``gpus`` (and ``taken`` already)."""
        k = self.share_key(key)
        used = self.used_nb.get(k, 0.0) - self.chosen.get(k, 0.0) - taken
        return used - gpus >= self.guar.get(k, 0.0) - EPS


def _add(d: dict[str, float], k: str, x: float) -> None:
    d[k] = d.get(k, 0.0) + x


class Admission(CycleBase):
    """The state of one cycle of the caldera policy and its admission rules. The layers above it
    (:mod:`caldera_preemption`, :mod:`caldera_reservations`, :mod:`caldera_ordering`) add one idea each."""

    # set up by the ordering (caldera_ordering) and the running jobs (caldera_policy), read by every layer
    grank: list[int]
    gq: list[_Queue]
    groups: list[tuple]
    ugroups: dict[tuple[str, str], list[int]]
    qr_groups: dict[tuple[str, int], list[int]]
    qr_open: dict[tuple[str, int], bool]
    _flags: tuple
    directed_groups: set[int]
    _contrib: dict[str, float]

    def __init__(self, pol: CalderaOptions, snap: Snapshot) -> None:
        super().__init__(snap, pol.default_runtime_estimate_s)
        self.pol = pol
        self.thr = pol.starvation_threshold_s
        self.las_on = pol.las_thresholds_gpu_s is not None
        self.las_avail = 0  # GPUs of running batch jobs above the lowest attained-service level
        self.las_victims: list[Victim] = []  # those jobs, highest level first, then most GPUs, then youngest
        self._why: dict[str, str] = {}  # victim id -> why the candidate search offered it, when not by its kind
        self.queues: dict[str, _Queue] = {}
        self.users: dict[tuple[str, str], list[int]] = {}
        # victims to be (see _setup_running): job, class rank, GPUs, GPU model, attained-service level
        self._listed: list[tuple[SchedJob, int, int, str | None, int]] | None = []
        # running batch jobs in least-attained-service, not terminating, with GPUs: job, GPUs, level
        self.las_running: list[tuple[SchedJob, int, int]] = []
        self.be_victims: list[Victim] = []  # best-effort, youngest first
        self.qvictims: dict[str, list[Victim]] = {}  # per queue, not best-effort: lowest class, youngest first
        self.be_avail = 0
        # ids of queued best-effort jobs that aging promoted (those the loop looked at: QueuedPromotions)
        self.queued_be: AbstractSet[str] = frozenset()
        self.promoted_be: AbstractSet[str] = frozenset()  # the same, whatever las_best_effort
        self.next_promotion = math.inf  # the earliest time a promotion (caldera_aging) may change anything
        # jobs held back from the GPUs lent to best-effort jobs by best_effort_grace_s: id -> when the grace ends
        self.lent_grace_until: dict[str, float] = {}
        self.grace_wake = math.inf
        # GPUs of running best-effort batch jobs above the lowest attained-service level, and those jobs (the
        # victims of a best-effort job's least-attained-service), ordered as las_victims
        self.be_las_avail = 0
        self.be_las_victims: list[Victim] = []
        self._be_chosen = 0
        self.reclaimable = 0.0
        self.reservations: list[tuple[float, frozenset[int], str]] = []
        self.reserved_nodes: set[int] = set()
        self._excl_cache: dict[int, frozenset[int]] = {}
        self._excl_by_rt: dict[float | None, tuple[int, frozenset[int] | None, int]] = {}
        self._events_new: list[tuple[tuple, float]] = []
        self._events: list[tuple[float, int, int, float, int]] | None = None
        self.nofit: set[tuple] = set()
        self.nopre: set[tuple] = set()
        self._pot_cache: dict = {}
        self.max_pool = max((p.size for p in self.idx.pools.values()), default=0)

    def starving(self, job: SchedJob) -> bool:
        """Waited past its patience: the starvation threshold, or ``starvation_factor`` times its expected run time
        when longer (:func:`patience_s`)."""
        if self.thr is None:
            return False
        return self.now - job.waiting_since >= patience_s(self.thr, self.pol.starvation_factor, job.runtime_s or 0.0)

    def las_level(self, attained_gpu_s: float) -> int:
        """0 below the first attained-service threshold, 1 up to the second, and so on."""
        return bisect.bisect_right(self.pol.las_thresholds_gpu_s or (), attained_gpu_s)

    def q(self, name: str) -> _Queue:
        st = self.queues.get(name)
        if st is None:
            st = self.queues[name] = _Queue(name, self.snap.queues.get(name))
        return st

    def _user_reason(self, cap: str, limit: int, used: int, q: _Queue, user: str, need: int = 0) -> Reason:
        key = (USER_CAP, cap, limit, used, need, q.name, user)
        r = self.rcache.get(key)
        if r is None:
            if cap == "max_gpus":
                msg = f"user cap of {limit} GPUs reached"
                if used < limit:
                    msg += f" ({used} in use, this job needs {need})"
            elif cap == "max_interactive_jobs":
                msg = f"user cap of {limit} interactive jobs reached"
            else:
                msg = f"user cap of {limit} running jobs reached"
            d = {"cap": cap, "limit": limit, "used": used, "queue": q.name, "user": user}
            if need:
                d["requested"] = need
            r = self.rcache[key] = Reason(USER_CAP, msg, d)
        return r

    def _capability_reason(self, q: _Queue, key: str, used: float, cap: float, need: float) -> Reason:
        ck = (QUEUE_CAPABILITY, q.name, key, used, need)
        r = self.rcache.get(ck)
        if r is None:
            msg = f"queue at its capability for {key} ({num(used)} of {num(cap)} used)"
            if need and used < cap - EPS:
                msg += f", this job needs {num(need)}"
            d = {"resource": key, "used": num(used), "limit": num(cap), "queue": q.name}
            if need:
                d["requested"] = num(need)
            r = self.rcache[ck] = Reason(QUEUE_CAPABILITY, msg, d)
        return r

    def _user_cap(self, job: SchedJob, q: _Queue, need_g: int) -> Reason | None:
        """The user cap ``job`` would exceed, if any; a cap already reached blocks the user's other groups."""
        uk = (job.queue, job.user)
        us = self.users.get(uk)
        if us is None:
            us = self.users[uk] = [0, 0, 0]
        if q.max_run is not None and us[2] >= q.max_run:
            r = self._user_reason("max_running_jobs", q.max_run, us[2], q, job.user)
            for gk in self.ugroups.get(uk, ()):
                self.block(gk, r, False)
            return r
        if job.interactive and q.max_int is not None and us[1] >= q.max_int:
            return self._user_reason("max_interactive_jobs", q.max_int, us[1], q, job.user)
        if need_g and q.max_gpus is not None and us[0] + need_g > q.max_gpus:
            if us[0] >= q.max_gpus:
                r = self._user_reason("max_gpus", q.max_gpus, us[0], q, job.user)
                for gk in self.ugroups.get(uk, ()):
                    self.block(gk, r, True)
                return r
            return self._user_reason("max_gpus", q.max_gpus, us[0], q, job.user, need_g)
        return None

    def _capability(
        self, q: _Queue, model: str | None, cpu: float, mem: float, need_g: int
    ) -> tuple[Reason | None, frozenset[str] | None]:
        """The capability of ``q`` a job needing ``cpu``, ``mem`` and ``need_g`` GPUs (of ``model``) would exceed,
        or the GPU models it must keep off (a job without a model may use any other)."""
        used = q.used
        ex: set[str] | None = None
        for key, cap in q.cap.items():
            if key == CPU:
                need = cpu
            elif key == MEMORY:
                need = mem
            elif key == GPU:
                need = need_g
            else:
                if not need_g:
                    continue
                if model is None:
                    if used.get(key, 0.0) + need_g > cap + EPS:
                        if ex is None:
                            ex = set()
                        ex.add(key[4:])
                    continue
                need = need_g if key == GPU + "/" + model else 0
            if need and used.get(key, 0.0) + need > cap + EPS:
                return self._capability_reason(q, key, used.get(key, 0.0), cap, need), None
        if not ex:
            return None, None
        if all(m in ex for m in self.idx.pools):
            key = GPU + "/" + sorted(ex)[0]
            return self._capability_reason(q, key, used.get(key, 0.0), q.cap[key], need_g), None
        return None, frozenset(ex)


def patience_s(threshold_s: float, factor: float, runtime_s):
    """How long a job may wait before it is starving: the threshold, or ``factor`` times its expected run time
    when that is longer (works on floats and arrays). On a busy week every job waits past a fixed threshold;
    relative to the run time, only those whose wait is long for their size are starving."""
    return np.maximum(threshold_s, factor * runtime_s)
