"""Preemption in the ``caldera`` policy: who may be preempted for whom (best-effort jobs for anyone, lower classes
of the same queue, reclaim of a guarantee from queues above their deserved share), in which order, and whether a
group of waiting jobs could still preempt at all (so cycles skip the ones that cannot).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from operator import attrgetter

from caldera.core.resources import GPU
from caldera.scheduler.caldera_admission import Admission, _add, _Queue
from caldera.scheduler.caldera_options import CLASS_NAMES, EPS
from caldera.scheduler.engine import Victim, rank_of
from caldera.scheduler.reasons import (
    PREEMPT_BEST_EFFORT,
    PREEMPT_LAS,
    PREEMPT_PRIORITY,
    PREEMPT_RECLAIM,
    WAITING_FOR_PREEMPTION,
    hhmm,
    num,
)
from caldera.scheduler.snapshot import Preempt, Reason, SchedJob


def _VKEY(v: Victim) -> tuple[int, float]:
    return (v.rank, -v.started)


_STARTED = attrgetter("started")
_RANK = attrgetter("rank")
_LEVEL_GPUS_STARTED = attrgetter("level", "gpus", "started")


class Preemption(Admission):
    def _ensure_victims(self) -> None:
        """``be_victims`` (youngest first) and ``qvictims`` (per queue: lowest class, then youngest first)."""
        if self._listed is None:
            return
        be_victims = self.be_victims
        qvictims = self.qvictims
        for job, rank, gpus, model, level in self._listed:
            v = Victim(job, rank, gpus, model)
            if rank == 0:
                be_victims.append(v)
            else:
                lst = qvictims.get(job.queue)
                if lst is None:
                    lst = qvictims[job.queue] = []
                lst.append(v)
            if level:
                v.level = level
                (self.las_victims if rank > 0 else self.be_las_victims).append(v)
        self._listed = None
        # highest level first, then the largest: fewer jobs pay a restart for the room (Philly 20 x 8: 275
        # preemptions -> 92, average JCT 28.7 h -> 26.8 h; the smallest victim that makes room gave more of both);
        # then the most attained service, the mirror of the queue's order (the job least likely to finish soon
        # goes first), or the youngest
        # (a descending sort keeps ties in order, as an ascending one on negated keys does; attrgetter keys and
        # one pass per key are cheaper than a tuple per victim, on a list rebuilt every cycle)
        for lst in (self.las_victims, self.be_las_victims):
            if self.pol.las_victims_by == "attained":
                lst.sort(key=lambda v: (v.level, v.gpus, v.job.attained_gpu_s, v.started), reverse=True)
            else:
                lst.sort(key=_LEVEL_GPUS_STARTED, reverse=True)
        be_victims.sort(key=_STARTED, reverse=True)
        for lst in qvictims.values():  # _VKEY: lowest class, then youngest
            lst.sort(key=_STARTED, reverse=True)
            lst.sort(key=_RANK)

    def all_victims(self) -> Iterator[Victim]:
        self._ensure_victims()
        yield from self.be_victims
        for lst in self.qvictims.values():
            yield from lst
        yield from self.anon
        for lst in self.directed.values():
            yield from lst

    def _update_reclaimable(self, names) -> None:
        """Upper bound of the GPUs reclaim could take: GPUs of queues above a deserved share (maintained per
        queue)."""
        contrib = self._contrib
        for name in names:
            q = self.queues[name]
            used = q.used_nb.get(GPU, 0.0) - q.chosen.get(GPU, 0.0)
            c = 0.0
            if used > 0 and (
                GPU not in q.des
                or any(
                    q.used_nb.get(k, 0.0) - q.chosen.get(k, 0.0) > d + EPS
                    for k, d in q.des.items()
                    if k == GPU or k.startswith(GPU + "/")
                )
            ):
                c = used
            old = contrib.get(name, 0.0)
            if c != old:
                contrib[name] = c
                self.reclaimable += c - old

    def _could_preempt(self) -> bool:
        """Whether any waiting job might preempt anyone, reservations aside: a best-effort job runs (or started in
        this cycle) while others wait, one above the lowest attained-service level runs while a best-effort job
        waits, a queue with waiting jobs has a guarantee to reclaim with, or a queue runs jobs of a lower class
        than one it has waiting."""
        pol = self.pol
        lowest: dict[str, int] = {}  # queue -> lowest class of its running (and just started) GPU jobs
        for q in self.queues.values():
            for r in range(4):
                if q.rank_gpus[r]:
                    lowest[q.name] = r
                    break
        for job in self.started_jobs:
            if job.request.gpu:
                r = rank_of(job.priority)
                if r < lowest.get(job.queue, 4):
                    lowest[job.queue] = r
        waiting_ranks = [
            (q, max((self.grank[k] for k in q.groups), default=-1)) for q in self.queues.values() if q.groups
        ]
        if 0 in lowest.values() and any(r > 0 for _, r in waiting_ranks):
            return True
        if self.be_las_avail > 0 and 0 in self.grank:  # a best-effort job waits, a best-effort job ran long
            return True
        for q, r in waiting_ranks:
            if pol.reclaim and q.gpu_keys_guar and r > 0:
                return True
            if pol.priority_preemption and 0 < lowest.get(q.name, 4) < r:
                return True
        return False

    def close_avenues(self) -> None:
        self._refresh_pre()

    def _refresh_pre(self, queues: Iterable[str] | None = None) -> None:
        """Which groups could still preempt (or use soon-free capacity): ``pre[group]`` = largest node size or 0.
        Re-evaluated per (queue, priority rank); only for ``queues`` unless a cluster-wide avenue opened or closed."""
        pol = self.pol
        anon = self.anon_open > 0 and not self.gave_up
        cap = pol.max_preemptions_per_cycle
        more = (cap is None or len(self.preemptions) < cap) and not self.gave_up
        be = more and self.be_avail > 0
        las = more and self.las_on and self.las_avail > 0
        rec = more and pol.reclaim and self.reclaimable > 0
        prio = more and pol.priority_preemption
        be_las = more and self.be_las_avail > 0
        flags = (anon, be, rec, prio, las, be_las)
        if flags != self._flags or queues is None:
            self._flags = flags
            keys: Iterable[tuple[str, int]] = self.qr_groups
        else:
            qset = set(queues)
            keys = [key for key in self.qr_groups if key[0] in qset]
        nmax = self.nmax
        dg = self.directed_groups
        for key in keys:
            qn, r = key
            ok = anon
            if not ok and r > 0:
                q = self.queues[qn]
                ok = be or (rec and q.headroom_open()) or (prio and sum(q.rank_gpus[:r]) > 0) or las
            elif not ok:
                ok = be_las
            if ok == self.qr_open.get(key):
                continue
            self.qr_open[key] = ok
            for k in self.qr_groups[key]:
                self.set_pre(k, nmax if (ok or k in dg) else 0)

    def _claim_key(self, q: _Queue, model: str | None) -> str:
        if model is not None:
            mk = GPU + "/" + model
            if mk in q.guar:
                return mk
        return GPU

    def _preempt(
        self,
        job: SchedJob,
        q: _Queue,
        rank: int,
        k: int,
        g: int,
        model: str | None,
        cpu: float,
        mem: int,
        n: int,
        excluded,
        exclude_models,
        shape,
        rmask,
    ) -> Reason | None:
        pol = self.pol
        need = g * n
        directed = [v for v in self.directed.get(job.id, ()) if not v.claimed] if self.directed else []
        if rank == 0:  # a best-effort job: only least-attained-service among best-effort jobs
            be, las, may_las = 0, self.be_las_avail, True
        else:
            # not a job that opted out of least-attained-service, nor (las_promoted_best_effort off) a best-effort
            # job that aging promoted: those take free GPUs and best-effort jobs only
            may_las = self.las_on and job.las and (pol.las_promoted_best_effort or job.id not in self.promoted_be)
            be, las = self.be_avail, self.las_avail if may_las else 0
        take_lent = not be or self._lent_grace_over(job)
        # failing stays failing within a cycle, for the jobs that may take no more victims than the one that failed:
        # capacity, victims and eligibility only shrink
        pkey = (q.name, rank, shape, rmask, exclude_models, take_lent, may_las)
        if not directed and pkey in self.nopre:
            return None
        ckey = self._claim_key(q, model)
        reclaim_ok = False
        if rank and pol.reclaim and (self.reclaimable > 0 or self.be_avail > 0):  # best-effort: interactive too
            gq = q.guar.get(ckey, 0.0)
            reclaim_ok = gq > 0 and (q.used_nb.get(ckey, 0.0) + q.claimed.get(ckey, 0.0) + need <= gq + EPS)
        if not take_lent:
            if not reclaim_ok:  # interactive best-effort jobs stay fair game for a reclaim
                be = 0
            if pol.best_effort_grace_scope == "all":
                las = 0  # no least-attained-service victim instead of the borrowers either
        low = sum(q.rank_gpus[1:rank]) if pol.priority_preemption else 0
        bound: float = self.idx.free_gpus(model) + sum(v.gpus for v in directed) + self.anon_open + be
        if reclaim_ok:
            bound += self.reclaimable
        bound += low + las
        if bound < need:
            return None
        if not directed and not self.anon_open and not be and not reclaim_ok and not low and not las:
            return None
        cap = pol.max_preemptions_per_cycle
        allow_new = (cap is None or len(self.preemptions) < cap) and not self.gave_up
        if not directed and not (allow_new or (self.anon_open and not self.gave_up)):
            return None
        cands = self._candidates(job, q, rank, model, ckey, reclaim_ok, directed, allow_new, take_lent, las > 0)
        got = self.try_with(
            g,
            model,
            cpu,
            mem,
            n,
            excluded,
            exclude_models,
            cands,
            self._potential(q, rank, reclaim_ok and allow_new, allow_new, directed, allow_new and las > 0),
        )
        if got is None:
            if not directed:
                self.nopre.add(pkey)
            return None
        plan, needed = got
        new = [v for v in needed if not v.soon]
        soon = [v for v in needed if v.soon]
        for v in soon:
            v.claimed = True
            if v in self.anon:
                self.anon_open -= v.gpus
        for v in new:
            self._choose(v, job, q, rank, ckey)
        _add(q.claimed, GPU, need)
        if plan[0] is not None and ckey != GPU:
            _add(q.claimed, ckey, need)
        if new or soon:
            touched = {q.name, *(v.queue for v in new)}
            self._update_reclaimable(touched)
            self._refresh_pre(touched)
        ids = [v.id for v in needed]
        what = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
        return Reason(
            WAITING_FOR_PREEMPTION,
            f"waiting for {len(ids)} preempted job{'s' if len(ids) != 1 else ''} ({what}) to release their resources",
            {"victims": ids, "new_preemptions": [v.id for v in new], "soon_free_gpus": sum(v.gpus for v in needed)},
        )

    def _lent_grace_over(self, job: SchedJob) -> bool:
        """Whether ``job`` has waited ``best_effort_grace_s`` since it was queued, and so may take back GPUs lent to
        best-effort batch jobs; if not, the cycle wakes when it has (:meth:`timed_wake`) and its ``GangNoFit``
        reason says when (:meth:`grace_reason`)."""
        grace = self.pol.best_effort_grace_s
        if not grace:
            return True
        since = job.waiting_since
        if self.now - since >= grace:
            return True
        self.lent_grace_until[job.id] = since + grace
        self.grace_wake = min(self.grace_wake, since + grace)
        return False

    def grace_reason(self, job: SchedJob, r: Reason) -> Reason:
        """``r`` (why ``job`` does not fit) with when it may take back the GPUs lent to best-effort jobs, while it
        waits for ``best_effort_grace_s``."""
        until = self.lent_grace_until.get(job.id)
        if until is None:
            return r
        return Reason(
            r.code,
            f"{r.message}; GPUs lent to best-effort jobs are taken back for it only from {hhmm(until)}, when it has "
            f"waited {num(self.pol.best_effort_grace_s)} s",
            {**r.details, "best_effort_grace_until": until},
        )

    def _node_gpus(self, victims: Iterable[Victim]) -> dict[int, int]:
        """Per node, the GPUs the victims hold there. An upper bound for :meth:`_potential`, so it counts the
        allocated device indices instead of building each victim's device masks (most are never tried)."""
        out: dict[int, int] = {}
        by_name = self.idx.by_name
        for v in victims:
            if v.chosen or v.claimed:
                continue
            if v.parts is not None:
                for i, m, _, _ in v.parts:
                    out[i] = out.get(i, 0) + m.bit_count()
                continue
            for a in v.allocs:
                node = by_name.get(a.node)
                if node is not None:
                    out[node] = out.get(node, 0) + len(a.gpus)
        return out

    def _potential(
        self, q: _Queue, rank: int, reclaim: bool, allow_new: bool, directed: list[Victim], las: bool = False
    ):
        """Upper bound, per node, of the GPUs this claimer could get there: free ones plus those of every victim it
        may take (built once per cycle per category, when first needed; victims taken since only make it looser)."""
        self._ensure_victims()
        pc = self._pot_cache
        parts = [self._anon_nodes]
        if allow_new and rank == 0:
            if las:
                if "be_las" not in pc:
                    pc["be_las"] = self._node_gpus(self.be_las_victims)
                parts.append(pc["be_las"])
        elif allow_new:
            if "be" not in pc:
                pc["be"] = self._node_gpus(self.be_victims)
            parts.append(pc["be"])
            if self.pol.priority_preemption and rank > 1:
                key = (q.name, rank)
                own = pc.get(key)
                if own is None:
                    own = pc[key] = self._node_gpus(v for v in self.qvictims.get(q.name, ()) if v.rank < rank)
                parts.append(own)
            if reclaim:
                if "rec" not in pc:
                    pc["rec"] = self._node_gpus(
                        v for name, lst in self.qvictims.items() if self._contrib.get(name, 0.0) > 0 for v in lst
                    )
                parts.append(pc["rec"])
            if las:
                if "las" not in pc:
                    pc["las"] = self._node_gpus(self.las_victims)
                parts.append(pc["las"])
        if directed:
            parts.append(self._node_gpus(directed))
        free = self.idx.free

        def pot(i: int) -> int:
            t = free[i].bit_count()
            for d in parts:
                t += d.get(i, 0)
            return t

        return pot

    def _candidates(
        self,
        job: SchedJob,
        q: _Queue,
        rank: int,
        model: str | None,
        ckey: str,
        reclaim_ok: bool,
        directed: list[Victim],
        allow_new: bool = True,
        take_lent: bool = True,
        take_las: bool = True,
    ) -> Iterator[Victim]:
        """Victims in preference order: soon-free ones first, then best-effort (youngest first: the least work
        lost; not before ``best_effort_grace_s``, ``take_lent``), then the lowest class and youngest among lower
        classes of the same queue and, when reclaiming, jobs of queues above their deserved share."""
        yield from directed
        for v in self.anon:
            if not v.claimed and (model is None or v.model == model):
                yield v
        if not allow_new:
            return
        self._ensure_victims()
        if rank == 0:
            for v in self._be_las_candidates(job, model):
                self._why[v.id] = PREEMPT_LAS
                yield v
            return
        if self._be_chosen > 32:
            self.be_victims = [v for v in self.be_victims if not v.chosen]
            self._be_chosen = 0
        # a best-effort job that aging promoted takes best-effort jobs only as they could take it, by attained service
        # (measured without: Alibaba 2 x 8 39.43 h against 38.88 h, 3 x 8 32.93 h against 32.69 h)
        be_level = -1
        if job.id in self.queued_be and job.las and self.las_on:
            be_level = self.las_level(job.attained_gpu_s)
        for v in self.be_victims:
            if not v.chosen and (model is None or v.model == model):
                if not v.job.interactive:
                    if take_lent and (v.level > be_level or not v.job.las):
                        yield v
                elif reclaim_ok and v.queue != q.name:  # an interactive job only to reclaim a guarantee
                    self._why[v.id] = PREEMPT_RECLAIM
                    yield v
        gens = []
        if self.pol.priority_preemption and rank > 1:
            own = self.qvictims.get(q.name)
            if own:
                gens.append(self._lower(own, rank, model))
        if reclaim_ok:
            for name, lst in self.qvictims.items():
                if name != q.name and lst and self._contrib.get(name, 0.0) > 0:
                    gens.append(self._over(self.queues[name], lst, ckey, model))
        seen: set[str] = set()
        if len(gens) == 1:
            merged: Iterator[Victim] = gens[0]
        else:
            merged = heapq.merge(*gens, key=_VKEY)
        for v in merged:
            seen.add(v.id)
            yield v
        if self.las_on and self.las_avail > 0 and take_las:
            for v in self._las_candidates(job, q, rank, model, ckey):
                if v.id not in seen:
                    self._why[v.id] = PREEMPT_LAS
                    yield v

    @staticmethod
    def _lower(lst: list[Victim], rank: int, model: str | None) -> Iterator[Victim]:
        for v in lst:
            if v.rank >= rank:
                return
            if not v.chosen and not v.job.interactive and (model is None or v.model == model):
                yield v

    def _las_candidates(self, job: SchedJob, q: _Queue, rank: int, model: str | None, ckey: str) -> Iterator[Victim]:
        """Batch jobs (that did not opt out) with more attained service than ``job``, most first: of its own queue,
        or of other queues that stay at their guarantee (with ``las_across_queues="share"``: only of queues above
        their deserved share); not of a higher class, and not
        before they have run ``las_min_run_s`` since their last start (a preemption costs them a restart)."""
        if not job.las:
            return
        level = self.las_level(job.attained_gpu_s)
        across = self.pol.las_across_queues == "guarantee"
        latest = self.now - self.pol.las_min_run_s
        taken: dict[str, float] = {}
        for v in self.las_victims:
            if v.level <= level:
                return  # sorted by level, highest first
            if v.chosen or v.rank > rank or v.started > latest or (model is not None and v.model != model):
                continue
            if v.queue != q.name:
                vq = self.queues[v.queue]
                t = taken.get(v.queue, 0.0)
                if not (vq.keeps_guarantee(ckey, t, v.gpus) if across else vq.over_share(ckey, t, v.gpus)):
                    continue
                taken[v.queue] = t + v.gpus
            yield v

    def _be_las_candidates(self, job: SchedJob, model: str | None) -> Iterator[Victim]:
        """For a best-effort job: best-effort batch jobs running as such in a higher attained-service level than
        ``job``, highest first, that have run ``las_min_run_s`` since their last start. Not a higher class, nor a
        best-effort job that aging promoted: taking those too (at once, or after 4 or 10 h of run) ended in 1.1-13
        times the preemptions and a worse average JCT and Jain on Alibaba's trace, long pods restarting again and
        again."""
        level = self.las_level(job.attained_gpu_s)
        latest = self.now - self.pol.las_min_run_s
        for v in self.be_las_victims:
            if v.level <= level:
                return  # sorted by level, highest first
            if v.chosen or v.started > latest or v.job.interactive or not v.job.las:
                continue
            if model is None or v.model == model:
                yield v

    @staticmethod
    def _over(vq: _Queue, lst: list[Victim], ckey: str, model: str | None) -> Iterator[Victim]:
        taken = 0
        for v in lst:
            if v.chosen or (model is not None and v.model != model):
                continue
            if vq.over_share(ckey, taken, v.gpus):
                taken += v.gpus  # tentatively: the queue must stay at its guarantee even if all go
                yield v
            elif not vq.over_share(ckey, taken, 0):
                return

    def _choose(self, v: Victim, job: SchedJob, q: _Queue, rank: int, ckey: str) -> None:
        v.chosen = True
        self.chosen.append(v)
        vq = self.queues[v.queue]
        vq.rank_gpus[v.rank] -= v.gpus
        why = self._why.pop(v.id, None)
        if v.job.las and v.rank > 0 and v.level:
            self.las_avail -= v.gpus
        if v.rank == 0 and v.level:
            self.be_las_avail -= v.gpus
        if v.rank == 0:
            self.be_avail -= v.gpus
            self._be_chosen += 1
        if why == PREEMPT_LAS and (rank == 0 or v.rank > 0):  # a best-effort job takes only through LAS
            code = PREEMPT_LAS
            msg = (
                f"job {v.id} (queue {v.queue}, attained {num(round(v.attained))} GPU-s) preempted by job {job.id} "
                f"(queue {job.queue}, attained {num(round(job.attained_gpu_s))} GPU-s): batch jobs with less "
                f"attained service go first"
            )
        elif v.rank == 0 and why != PREEMPT_RECLAIM:
            code = PREEMPT_BEST_EFFORT
            msg = (
                f"best-effort job {v.id} (queue {v.queue}) preempted by job {job.id} (queue {job.queue}, "
                f"{CLASS_NAMES[rank]}): best-effort jobs run only on idle capacity"
            )
        elif v.rank == 0:
            code = PREEMPT_RECLAIM
            msg = (
                f"interactive best-effort job {v.id} (queue {v.queue}) preempted by job {job.id} (queue "
                f"{job.queue}): queue {job.queue} is below its {ckey} guarantee ({num(q.used_nb.get(ckey, 0.0))} of "
                f"{num(q.guar.get(ckey, 0.0))} used)"
            )
        elif v.queue == job.queue:
            code = PREEMPT_PRIORITY
            msg = (
                f"job {v.id} ({CLASS_NAMES[v.rank]}) preempted by higher-priority job {job.id} ({CLASS_NAMES[rank]}) "
                f"in queue {job.queue}"
            )
        else:
            code = PREEMPT_RECLAIM
            sk = vq.share_key(ckey)
            vused = vq.used_nb.get(sk, 0.0) - vq.chosen.get(sk, 0.0)
            msg = (
                f"job {v.id} (queue {v.queue}, {CLASS_NAMES[v.rank]}) preempted by job {job.id} (queue {job.queue}): "
                f"queue {job.queue} is below its {ckey} guarantee ({num(q.used_nb.get(ckey, 0.0))} of "
                f"{num(q.guar.get(ckey, 0.0))} used) and queue {v.queue} is above its deserved share "
                f"({num(vused)} of {num(vq.des.get(sk, 0.0))})"
            )
        if v.rank > 0 and v.gpus:
            _add(vq.chosen, GPU, v.gpus)
            if v.model:
                _add(vq.chosen, GPU + "/" + v.model, v.gpus)
        self.preemptions.append(Preempt(v.id, job.id, code, msg))
