"""Reservations and backfill in the ``caldera`` policy: a job waiting past the starvation threshold gets the nodes
that free up first held for it; other jobs may use them only if their runtime limit ends before the reservation.
"""

from __future__ import annotations

from caldera.scheduler.caldera_options import EPS
from caldera.scheduler.caldera_preemption import Preemption
from caldera.scheduler.reasons import (
    BACKFILL_BLOCKED,
    RESERVED,
    hhmm,
    num,
)
from caldera.scheduler.snapshot import Reason, SchedJob


class Reservations(Preemption):
    def _explain(self, job: SchedJob, group: int) -> Reason:
        req = job.request
        g = req.gpu
        if self.reservations and g <= self.bres:
            _, rmask = self._exclusion(job)
            if rmask:
                shape = (g, req.gpu_model, req.cpu, req.memory_mib, job.replicas)
                bkey = (BACKFILL_BLOCKED, shape, rmask, None)
                if bkey not in self.nofit:
                    if self.idx.place(g, req.gpu_model, req.cpu, req.memory_mib, job.replicas) is not None:
                        return self._backfill_reason(job, rmask)
                    self.nofit.add(bkey)
        return super()._explain(job, group)

    def update_bfree(self) -> None:
        idx = self.idx
        if self.min_cpu is not None:
            mc, mm = self.min_cpu, self.min_mem or 0
            b = idx.max_block_where(mc, mm, self.reserved_nodes or None)
            r = idx.max_block_where(mc, mm, None) if self.reserved_nodes else 0
        elif self.reserved_nodes:
            b, r = idx.max_block_excluding(self.reserved_nodes), idx.max_block()
        else:
            b, r = idx.max_block(), 0
        if b != self.bfree or r != self.bres:
            self.bfree, self.bres = b, r
            self.mver += 1

    def _exclusion(self, job: SchedJob) -> tuple[frozenset[int] | None, int]:
        rt = job.runtime_s
        hit = self._excl_by_rt.get(rt)
        if hit is not None and hit[0] == len(self.reservations):
            return hit[1], hit[2]
        end = self.now + rt if rt else float("inf")
        mask = 0
        for b, (t, _, jid) in enumerate(self.reservations):
            if end > t and jid != job.id:
                mask |= 1 << b
        if not mask:
            self._excl_by_rt[rt] = (len(self.reservations), None, 0)
            return None, 0
        ex = self._excl_cache.get(mask)
        if ex is None:
            s: set[int] = set()
            for b, (_, nodes, _) in enumerate(self.reservations):
                if mask >> b & 1:
                    s |= nodes
            ex = self._excl_cache[mask] = frozenset(s)
        self._excl_by_rt[rt] = (len(self.reservations), ex, mask)
        return ex, mask

    def _backfill_reason(self, job: SchedJob, rmask: int) -> Reason:
        b = (rmask & -rmask).bit_length() - 1
        t, _, jid = self.reservations[b]
        rt = job.runtime_s
        if not rt:
            limit = "it has no runtime limit (nor an estimate)"
        elif job.max_runtime_s:
            limit = f"its runtime limit ({num(float(rt))} s) ends after that"
        else:
            limit = f"its expected run time ({num(float(rt))} s) ends after that"
        key = (BACKFILL_BLOCKED, jid, rt)
        r = self.rcache.get(key)
        if r is None:
            r = self.rcache[key] = Reason(
                BACKFILL_BLOCKED,
                f"would fit now, but the free resources are reserved for job {jid} from {hhmm(t)} and {limit}",
                {"reserved_for": jid, "reserved_start": t, "max_runtime_s": rt},
            )
        return r

    def _event_tuples(self, allocs, t: float) -> list[tuple[float, int, int, float, int]]:
        idx = self.idx
        out = []
        for a in allocs:
            i = idx.by_name.get(a.node)
            if i is not None:
                out.append((max(t, self.now), i, idx._mask(i, a.gpus), a.cpu, a.memory_mib))
        return out

    def _build_events(self) -> list[tuple[float, int, int, float, int]]:
        """(time, node, device mask, cpu, memory) as resources are expected to free up, sorted."""
        idx = self.idx
        now = self.now
        rt = self.runtime_estimate
        ev: list[tuple[float, int, int, float, int]] = []
        seen: set[str] = set()
        # Victims matter only once this cycle preempted or claimed soon-free capacity (chosen ones free up now, the
        # unused rest of one is counted with it); until then every running job simply frees what it holds when it
        # ends, and no Victim objects are needed for that.
        for v in self.all_victims() if self.n_holds else ():
            if not v.allocs:  # the unused rest of a victim: already counted with it
                continue
            seen.add(v.id)
            job = v.job
            if job.terminating or v.chosen:
                t = now
            else:
                t = max(now, v.started + rt(job))
            for i, m, c, mm in v.node_parts(idx):
                ev.append((t, i, m, c, mm))
        for job in self.snap.running:  # the rest: CPU-only jobs, or everyone when no victim was touched
            if job.id in seen:
                continue
            st = job.started_at if job.started_at is not None else now
            t = now if job.terminating else max(now, st + rt(job))
            ev.extend(self._event_tuples(job.allocations, t))
        for st_, job in zip(self.starts, self.started_jobs):
            ev.extend(self._event_tuples(st_.allocations, now + rt(job)))
        self._events_new = []
        ev.sort()
        return ev

    def _reserve(
        self, job: SchedJob, g: int, model: str | None, cpu: float, mem: int, n: int, exclude_models
    ) -> Reason | None:
        if self._events is None:
            self._events = self._build_events()
        elif self._events_new:
            ev = list(self._events)
            for allocs, t in self._events_new:
                ev.extend(self._event_tuples(allocs, t))
            ev.sort()
            self._events = ev
            self._events_new = []
        idx = self.idx
        best: tuple[float, list[int]] | None = None
        pools = (
            [model]
            if model is not None
            else [m for m in idx.models_sorted if not (exclude_models and m in exclude_models)]
        )
        if g <= 0:
            return None
        for m in pools:
            found = self._earliest_in_pool(m, g, cpu, mem, n)
            if found is not None and (best is None or found[0] < best[0]):
                best = found
        if best is None:
            return None
        t, nodes = best
        self.reservations.append((t, frozenset(nodes), job.id))
        self.reserved_nodes.update(nodes)
        self.horizon = max(self.horizon, t - self.now)
        if len(self.reservations) >= self.pol.max_reservations:
            self.must_see = None
        self.mver += 1
        self.update_bfree()
        names = [idx.names[i] for i in nodes]
        return Reason(
            RESERVED,
            f"resources reserved after waiting past {num(float(self.thr or 0))} s: expected to start at "
            f"{hhmm(t)} on {', '.join(names[:4])}{' and more' if len(names) > 4 else ''} as running jobs "
            f"reach their runtime limits",
            {"reserved_start": t, "nodes": names},
        )

    def _earliest_in_pool(self, m: str, g: int, cpu: float, mem: int, n: int) -> tuple[float, list[int]] | None:
        """The earliest time ``n`` replicas of ``g`` GPUs fit on the unreserved ``m`` nodes as running jobs end
        (``_events``), and the nodes for them then."""
        idx = self.idx
        reserved = self.reserved_nodes
        pool = idx.pools.get(m)
        if pool is None or self._events is None:
            return None
        state: dict[int, list] = {}  # node -> [free mask, cpu, memory, model mask], created on first use
        caps: dict[int, int] = {}
        total = 0
        for f in range(g, pool.maxf + 1):
            for i in pool.buckets[f]:
                if i in reserved:
                    continue
                c = idx._cap(i, f // g, cpu, mem)
                if c:
                    caps[i] = c
                    total += c
        t_found = None
        if total >= n:
            t_found = self.now
        else:
            for t, i, mask, c_cpu, c_mem in self._events:
                st = state.get(i)
                if st is None:
                    if i in reserved:
                        continue
                    mm = 0
                    for m2, mask2 in idx.node_models[i]:
                        if m2 == m:
                            mm = mask2
                    if not mm:
                        continue
                    st = state[i] = [idx.free[i], idx.cpu[i], idx.mem[i], mm]
                st[0] |= mask
                st[1] += c_cpu
                st[2] += c_mem
                c = (st[0] & st[3]).bit_count() // g
                if cpu > 0:
                    c = min(c, int((st[1] + EPS) // cpu))
                if mem > 0:
                    c = min(c, st[2] // mem)
                c = max(c, 0)
                total += c - caps.get(i, 0)
                caps[i] = c
                if total >= n:
                    t_found = t
                    break
        if t_found is None:
            return None
        chosen = _gang_nodes(caps, n)
        return None if chosen is None else (t_found, chosen)


def _gang_nodes(caps: dict[int, int], n: int) -> list[int] | None:
    """Nodes for a gang of ``n`` replicas, given how many fit on each: as few as possible, best fit for the last."""
    cand = sorted((c, i) for i, c in caps.items() if c > 0)
    chosen: list[int] = []
    r = n
    while r > 0 and cand:
        whole = [(c, i) for c, i in cand if c >= r]
        c, i = whole[0] if whole else cand[-1]
        chosen.append(i)
        cand.remove((c, i))
        r -= min(c, r)
    return chosen if r <= 0 else None
