"""Free capacity of the cluster and where a gang of replicas fits.

Two layers:

* :class:`ClusterIndex`, what the policies use: free capacity per node kept as a bit mask of free devices plus free
  CPU and memory, and, per GPU model, the nodes bucketed by how many GPUs of that model they have free. Finding a
  node for a replica walks the buckets from the smallest block that fits upwards instead of scanning every node, so
  one placement costs about the number of distinct block sizes, not the number of nodes.
* :class:`NodeFree`, :func:`free_capacity` and :func:`place_gang`: the original small API, kept for callers that
  want plain per-node objects. It follows the same packing rule.

The packing rule (both layers): a gang is placed whole or not at all. All replicas get GPUs of one model. Replicas
go onto as few nodes as possible: while the remaining replicas fit on one node, take the node with the *least*
room that still holds them all (best fit, so large free blocks stay whole for large jobs and a 1-GPU job lands on
the most-used node); otherwise take the node that holds the most replicas and continue. CPU-only replicas prefer
nodes without free GPUs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from operator import attrgetter

from caldera.core.cluster import Allocation, Node
from caldera.core.resources import Resources
from caldera.scheduler.job import SchedJob

_EPS = 1e-9
_BIG = 1 << 30


_DINDEX = attrgetter("index")
_DMODEL = attrgetter("model")
_RANGES = {k: tuple(range(k)) for k in range(65)}
_anew = object.__new__
_set_node = Allocation.__dict__["node"].__set__
_set_gpus = Allocation.__dict__["gpus"].__set__
_set_cpu = Allocation.__dict__["cpu"].__set__
_set_mem = Allocation.__dict__["memory_mib"].__set__


def new_allocation(node: str, gpus: tuple[int, ...], cpu: float, memory_mib: int) -> Allocation:
    """``Allocation(node, gpus, cpu, memory_mib)`` without the frozen dataclass ``__init__`` (a few times faster;
    the object is the same)."""
    a = _anew(Allocation)
    _set_node(a, node)
    _set_gpus(a, gpus)
    _set_cpu(a, cpu)
    _set_mem(a, memory_mib)
    return a


class _Pool:
    """The nodes holding GPUs of one model, bucketed by how many of them are free."""

    __slots__ = ("model", "buckets", "maxf", "total", "size", "largest_node")

    def __init__(self, model: str, largest_node: int) -> None:
        self.model = model
        self.buckets: list[dict[int, None]] = [{} for _ in range(largest_node + 1)]
        self.maxf = 0  # largest non-empty bucket
        self.total = 0  # free GPUs of this model
        self.size = 0  # GPUs of this model in the cluster
        self.largest_node = largest_node


Plan = tuple[str | None, list[tuple[int, int]]]  # (GPU model or None for CPU-only, [(node index, replicas)])


class ClusterIndex:
    """Free capacity of the schedulable nodes, indexed by free-GPU count per GPU model.

    Nodes are referred to by index (position among the schedulable nodes). Allocations on nodes that are not in the
    index (unschedulable or unknown) are ignored. The index is mutable: :meth:`commit` takes a plan,
    :meth:`release` and :meth:`occupy` give back or take allocations (used to try preemptions), :meth:`save` and
    :meth:`restore` undo changes to a few nodes.
    """

    def __init__(self, nodes: Iterable[Node], running: Iterable[SchedJob] = ()) -> None:
        names: list[str] = []
        self.cpu: list[float] = []
        self.mem: list[int] = []
        self.free: list[int] = []  # bit p set: device at position p of node.gpus is free
        self.dev: list[tuple[int, ...]] = []  # position -> device index
        self.pos: list[dict[int, int] | None] = []  # device index -> position; None when index == position
        self.node_models: list[tuple[tuple[str, int], ...]] = []  # (model, mask of its positions)
        self.gpuless: list[int] = []
        self.nodes: list[Node] = []
        largest: dict[str, int] = {}
        for node in nodes:
            if not node.schedulable:
                continue
            i = len(names)
            names.append(node.name)
            self.nodes.append(node)
            self.cpu.append(float(node.cpu))
            self.mem.append(int(node.memory_mib))
            gpus = node.gpus
            ng = len(gpus)
            self.free.append((1 << ng) - 1)
            if not ng:
                self.dev.append(())
                self.pos.append(None)
                self.node_models.append(())
                self.gpuless.append(i)
                continue
            idx = tuple(map(_DINDEX, gpus))
            self.dev.append(idx)
            self.pos.append(None if idx == _RANGES.get(ng) else {d: p for p, d in enumerate(idx)})
            mods = set(map(_DMODEL, gpus))
            if len(mods) == 1:
                models: tuple[tuple[str, int], ...] = ((gpus[0].model, (1 << ng) - 1),)
            else:
                acc: dict[str, int] = {}
                for p, d in enumerate(gpus):
                    acc[d.model] = acc.get(d.model, 0) | (1 << p)
                models = tuple(acc.items())
            self.node_models.append(models)
            for m, mask in models:
                c = mask.bit_count()
                if c > largest.get(m, 0):
                    largest[m] = c
        self._cpu_nodes: list[int] | None = None
        self._cpu_cursor: dict[tuple, int] = {}
        self.names = names
        self.by_name = {n: i for i, n in enumerate(names)}
        self._largest = largest
        self.models_sorted = sorted(largest)
        self.largest_node = max(largest.values(), default=0)
        for job in running:
            for a in job.allocations:
                self._take_alloc(a)
        self._index_free()

    def _index_free(self) -> None:
        """Bucket the nodes by free GPUs per model, in node order (placement walks buckets in insertion order, so
        the same free capacity always gives the same choices)."""
        self.pools: dict[str, _Pool] = {m: _Pool(m, c) for m, c in self._largest.items()}
        pools = self.pools
        free = self.free
        for i, models in enumerate(self.node_models):
            fr = free[i]
            for m, mask in models:
                pool = pools[m]
                f = (fr & mask).bit_count()
                pool.buckets[f][i] = None
                pool.total += f
                pool.size += mask.bit_count()
                if f > pool.maxf:
                    pool.maxf = f

    def copy(self) -> ClusterIndex:
        """A new index over the same nodes and free capacity, exactly what ``ClusterIndex(nodes, running)`` builds
        for them, without walking the nodes and the running jobs' allocations again. A caller that keeps an index
        up to date (:meth:`occupy` as jobs start, :meth:`release` as they end, as the simulator does) hands a copy to
        each cycle through ``Snapshot.capacity``."""
        c = _anew(ClusterIndex)
        c.__dict__.update(self.__dict__)  # the nodes' layout is shared: nothing changes it after __init__
        c.free = list(self.free)
        c.cpu = list(self.cpu)
        c.mem = list(self.mem)
        c._cpu_nodes = None
        c._cpu_cursor = {}
        c._index_free()
        return c

    # ---------------------------------------------------------------------------------------------- queries
    @property
    def total_free_gpus(self) -> int:
        return sum(p.total for p in self.pools.values())

    @property
    def total_gpus(self) -> int:
        return sum(p.size for p in self.pools.values())

    def max_block(self, model: str | None = None, exclude_models: frozenset[str] | set[str] | None = None) -> int:
        """The most GPUs (of ``model``, or of any one model) free on one node."""
        if model is not None:
            pool = self.pools.get(model)
            return pool.maxf if pool is not None else 0
        best = 0
        for m, pool in self.pools.items():
            if exclude_models and m in exclude_models:
                continue
            if pool.maxf > best:
                best = pool.maxf
        return best

    def free_gpus(self, model: str | None = None) -> int:
        if model is not None:
            pool = self.pools.get(model)
            return pool.total if pool is not None else 0
        return self.total_free_gpus

    def node_free_gpus(self, i: int, model: str | None = None) -> int:
        fr = self.free[i]
        if model is None:
            return fr.bit_count()
        for m, mask in self.node_models[i]:
            if m == model:
                return (fr & mask).bit_count()
        return 0

    def fitting_replicas(
        self, g: int, model: str | None, cpu: float, mem: int, excluded: set[int] | frozenset[int] | None = None
    ) -> int:
        """How many replicas of this shape the free capacity holds in all (best model), for messages."""
        best = 0
        for m, pool in self.pools.items():
            if model is not None and m != model:
                continue
            if g <= 0:
                break
            tot = 0
            for f in range(g, pool.maxf + 1):
                for i in pool.buckets[f]:
                    if excluded is not None and i in excluded:
                        continue
                    tot += self._cap(i, f // g, cpu, mem)
            best = max(best, tot)
        return best

    def _cap(self, i: int, cap: int, cpu: float, mem: int) -> int:
        if cpu > 0:
            c = int((self.cpu[i] + _EPS) // cpu)
            if c < cap:
                cap = c
        if mem > 0:
            c = self.mem[i] // mem
            if c < cap:
                cap = c
        return cap if cap > 0 else 0

    # ---------------------------------------------------------------------------------------------- placing
    def place(
        self,
        g: int,
        model: str | None,
        cpu: float,
        mem: int,
        n: int,
        excluded: set[int] | frozenset[int] | None = None,
        exclude_models: set[str] | frozenset[str] | None = None,
        speeds: Mapping[str, float] | None = None,
    ) -> Plan | None:
        """Where ``n`` replicas of ``g`` GPUs (of ``model``, any one model when None), ``cpu`` cores and ``mem`` MiB
        each fit now, avoiding the ``excluded`` nodes; None when they do not all fit. Changes nothing. With
        ``speeds`` (per model) and no ``model``, the fastest model where they fit, then the fewest nodes and least
        left over; else only the latter."""
        if g <= 0:
            plan = self._place_cpu(cpu, mem, n, excluded)
            return (None, plan) if plan is not None else None
        if model is not None:
            pool = self.pools.get(model)
            if pool is None:
                return None
            plan = self._place_pool(pool, g, cpu, mem, n, excluded)
            return (model, plan) if plan is not None else None
        best: Plan | None = None
        best_key: tuple[float, int, int] | None = None
        for m in self.models_sorted:
            if exclude_models and m in exclude_models:
                continue
            pool = self.pools[m]
            plan = self._place_pool(pool, g, cpu, mem, n, excluded)
            if plan is None:
                continue
            if len(self.pools) == 1:
                return (m, plan)
            speed = -speeds.get(m, 1.0) if speeds else 0.0
            key = (speed, len(plan), sum(self.node_free_gpus(i, m) - k * g for i, k in plan))
            if best_key is None or key < best_key:
                best, best_key = (m, plan), key
        return best

    def _place_pool(
        self, pool: _Pool, g: int, cpu: float, mem: int, n: int, excluded: set[int] | frozenset[int] | None
    ) -> list[tuple[int, int]] | None:
        maxf = pool.maxf
        if maxf < g or pool.total < g * n:
            return None
        buckets = pool.buckets
        cpuf = self.cpu
        memf = self.mem
        plan: list[tuple[int, int]] = []
        used: set[int] | None = None
        r = n
        while True:
            need = r * g
            if need <= maxf:
                rc = cpu * r - _EPS
                rm = mem * r
                for f in range(need, maxf + 1):
                    b = buckets[f]
                    if not b:
                        continue
                    for i in b:
                        if cpuf[i] < rc or memf[i] < rm:
                            continue
                        if excluded is not None and i in excluded:
                            continue
                        if used is not None and i in used:
                            continue
                        plan.append((i, r))
                        return plan
            # no node holds all remaining replicas: take the one holding the most
            best = -1
            bestcap = 0
            for f in range(maxf, g - 1, -1):
                top = f // g
                if top <= bestcap:
                    break
                for i in buckets[f]:
                    if excluded is not None and i in excluded:
                        continue
                    if used is not None and i in used:
                        continue
                    c = self._cap(i, top, cpu, mem)
                    if c > bestcap:
                        bestcap, best = c, i
                        if c == top:
                            break
            if bestcap <= 0:
                return None
            plan.append((best, bestcap))
            r -= bestcap
            if used is None:
                used = set()
            used.add(best)

    def _cpu_order(self) -> list[int]:
        """Nodes for CPU-only work: nodes without GPUs, then by fewest free GPUs (so CPU-only work does not eat into
        the CPUs of nodes with free GPUs). Fixed at first use."""
        if self._cpu_nodes is None:
            self._cpu_nodes = list(self.gpuless) + sorted(
                (i for i in range(len(self.names)) if self.node_models[i]), key=lambda i: self.free[i].bit_count()
            )
        return self._cpu_nodes

    def _place_cpu(
        self, cpu: float, mem: int, n: int, excluded: set[int] | frozenset[int] | None
    ) -> list[tuple[int, int]] | None:
        # Capacity only shrinks between calls (a trial release is always restored), so a node that could not hold
        # one replica of this shape never will: per shape, the scan resumes where the last one stopped.
        order = self._cpu_order()
        key = (cpu, mem, excluded if isinstance(excluded, frozenset) else None)
        start = self._cpu_cursor.get(key, 0) if key[2] is not None or excluded is None else 0
        plan: list[tuple[int, int]] = []
        r = n
        first_ok = -1
        for p in range(start, len(order)):
            i = order[p]
            if excluded is not None and i in excluded:
                continue
            c = self._cap(i, _BIG, cpu, mem)
            if c <= 0:
                continue
            if first_ok < 0:
                first_ok = p
            k = c if c < r else r
            plan.append((i, k))
            r -= k
            if r == 0:
                break
        if key[2] is not None or excluded is None:
            self._cpu_cursor[key] = first_ok if first_ok >= 0 else len(order)
        return plan if r == 0 else None

    def max_block_where(self, min_cpu: float, min_mem: int, excluded: set[int] | frozenset[int] | None) -> int:
        """Like :meth:`max_block` over the nodes (not ``excluded``) with at least ``min_cpu`` and ``min_mem``
        free."""
        best = 0
        cpuf, memf = self.cpu, self.mem
        c = min_cpu - _EPS
        for pool in self.pools.values():
            b = pool.buckets
            for f in range(pool.maxf, best, -1):
                if any(cpuf[i] >= c and memf[i] >= min_mem and (excluded is None or i not in excluded) for i in b[f]):
                    best = f
                    break
        return best

    def max_block_excluding(self, excluded: set[int] | frozenset[int]) -> int:
        """Like :meth:`max_block` over the nodes not in ``excluded``."""
        best = 0
        for pool in self.pools.values():
            b = pool.buckets
            for f in range(pool.maxf, best, -1):
                if any(i not in excluded for i in b[f]):
                    best = f
                    break
        return best

    # ---------------------------------------------------------------------------------------------- changing
    def commit(self, plan: Plan, g: int, cpu: float, mem: int) -> tuple[Allocation, ...]:
        """Take the resources of ``plan`` (from :meth:`place`); returns one Allocation per replica."""
        return self._commit(plan, g, cpu, mem, True, None)

    def commit_masks(self, plan: Plan, g: int, cpu: float, mem: int) -> dict[int, int]:
        """Like :meth:`commit`, but returns the device bit mask taken on each node instead of Allocations."""
        taken: dict[int, int] = {}
        self._commit(plan, g, cpu, mem, False, taken)
        return taken

    def hold(self, i: int, mask: int, cpu: float, mem: int) -> None:
        """Take devices ``mask``, ``cpu`` and ``mem`` on node ``i`` (kept for a job waiting for preemptions)."""
        old = self.free[i]
        self.free[i] = old & ~mask
        self.cpu[i] -= cpu
        self.mem[i] -= mem
        self._reindex(i, old)

    def _commit(
        self, plan: Plan, g: int, cpu: float, mem: int, make_allocations: bool, masks: dict[int, int] | None
    ) -> tuple[Allocation, ...]:
        model, parts = plan
        out: list[Allocation] = []
        for i, k in parts:
            old = self.free[i]
            avail = old
            if model is not None:
                for m, mask in self.node_models[i]:
                    if m == model:
                        avail = old & mask
                        break
            dev = self.dev[i]
            taken = 0
            for _ in range(k):
                picked = []
                for _ in range(g):
                    low = avail & -avail
                    avail ^= low
                    taken |= low
                    picked.append(dev[low.bit_length() - 1])
                if make_allocations:
                    picked.sort()
                    out.append(new_allocation(self.names[i], tuple(picked), cpu, mem))
            if masks is not None:
                masks[i] = masks.get(i, 0) | taken
            self.free[i] = old & ~taken
            self.cpu[i] -= cpu * k
            self.mem[i] -= mem * k
            if taken:
                self._reindex(i, old)
        return tuple(out)

    def _mask(self, i: int, gpus: Iterable[int]) -> int:
        pos = self.pos[i]
        m = 0
        if pos is None:
            for d in gpus:
                m |= 1 << d
        else:
            for d in gpus:
                p = pos.get(d)
                if p is not None:
                    m |= 1 << p
        return m

    def _take_alloc(self, a: Allocation) -> int:
        i = self.by_name.get(a.node)
        if i is None:
            return -1
        self.free[i] &= ~self._mask(i, a.gpus)
        self.cpu[i] -= a.cpu
        self.mem[i] -= a.memory_mib
        return i

    def occupy(self, allocations: Iterable[Allocation]) -> None:
        """Mark allocations as in use."""
        for a in allocations:
            i = self.by_name.get(a.node)
            if i is None:
                continue
            old = self.free[i]
            self.free[i] = old & ~self._mask(i, a.gpus)
            self.cpu[i] -= a.cpu
            self.mem[i] -= a.memory_mib
            self._reindex(i, old)

    def release(self, allocations: Iterable[Allocation], trial: bool = False) -> None:
        """Give allocations back (the inverse of :meth:`occupy`). ``trial``: the caller will :meth:`restore` the
        nodes before placing anything CPU-only (keeps the CPU-only scan positions)."""
        if not trial:
            self._cpu_cursor.clear()
        for a in allocations:
            i = self.by_name.get(a.node)
            if i is None:
                continue
            old = self.free[i]
            self.free[i] = old | self._mask(i, a.gpus)
            self.cpu[i] += a.cpu
            self.mem[i] += a.memory_mib
            self._reindex(i, old)

    def give(self, i: int, mask: int, cpu: float, mem: int) -> None:
        """Give back devices ``mask``, ``cpu`` and ``mem`` on node ``i`` for a trial (the caller restores it)."""
        old = self.free[i]
        self.free[i] = old | mask
        self.cpu[i] += cpu
        self.mem[i] += mem
        self._reindex(i, old)

    def save(self, nodes: Iterable[int]) -> list[tuple[int, int, float, int]]:
        return [(i, self.free[i], self.cpu[i], self.mem[i]) for i in nodes]

    def restore(self, saved: list[tuple[int, int, float, int]]) -> None:
        for i, fr, cpu, mem in saved:
            old = self.free[i]
            self.free[i] = fr
            self.cpu[i] = cpu
            self.mem[i] = mem
            self._reindex(i, old)

    def _reindex(self, i: int, old: int) -> None:
        new = self.free[i]
        if new == old:
            return
        for m, mask in self.node_models[i]:
            of = (old & mask).bit_count()
            nf = (new & mask).bit_count()
            if of == nf:
                continue
            pool = self.pools[m]
            b = pool.buckets
            del b[of][i]
            b[nf][i] = None
            pool.total += nf - of
            if nf > pool.maxf:
                pool.maxf = nf
            elif of == pool.maxf and not b[of]:
                f = of
                while f > 0 and not b[f]:
                    f -= 1
                pool.maxf = f

    def allocation_model(self, a: Allocation) -> str | None:
        """The GPU model of an allocation's devices (its first device), None for CPU-only or unknown nodes."""
        if not a.gpus:
            return None
        i = self.by_name.get(a.node)
        if i is None:
            return None
        pos = self.pos[i]
        p = a.gpus[0] if pos is None else pos.get(a.gpus[0])
        if p is None:
            return None
        for m, mask in self.node_models[i]:
            if mask >> p & 1:
                return m
        return None


# -------------------------------------------------------------------------------------------------- simple API
@dataclass(slots=True)
class NodeFree:
    node: Node
    cpu: float
    memory_mib: int
    free_gpus: list[int]  # device indices, ascending

    def _usable(self, req: Resources) -> list[int]:
        if req.gpu_model:
            models = {d.index: d.model for d in self.node.gpus}
            return [i for i in self.free_gpus if models.get(i) == req.gpu_model]
        return self.free_gpus

    def replicas_fitting(self, req: Resources) -> int:
        cap = _BIG
        if req.cpu > 0:
            cap = min(cap, int((self.cpu + _EPS) // req.cpu))
        if req.memory_mib > 0:
            cap = min(cap, self.memory_mib // req.memory_mib)
        if req.gpu > 0:
            cap = min(cap, len(self._usable(req)) // req.gpu)
        return max(cap, 0)

    def fits(self, req: Resources) -> bool:
        return self.replicas_fitting(req) >= 1

    def take(self, req: Resources) -> Allocation:
        picked = self._usable(req)[: req.gpu]
        for i in picked:
            self.free_gpus.remove(i)
        self.cpu -= req.cpu
        self.memory_mib -= req.memory_mib
        return Allocation(self.node.name, tuple(picked), req.cpu, req.memory_mib)

    def give(self, alloc: Allocation) -> None:
        self.cpu += alloc.cpu
        self.memory_mib += alloc.memory_mib
        self.free_gpus = sorted(set(self.free_gpus) | set(alloc.gpus))


def free_capacity(nodes: list[Node], running: list[SchedJob]) -> dict[str, NodeFree]:
    """Capacity left on each schedulable node once running jobs' allocations are subtracted."""
    free = {n.name: NodeFree(n, n.cpu, n.memory_mib, [d.index for d in n.gpus]) for n in nodes if n.schedulable}
    for job in running:
        for a in job.allocations:
            nf = free.get(a.node)
            if nf is None:
                continue
            nf.cpu -= a.cpu
            nf.memory_mib -= a.memory_mib
            taken = set(a.gpus)
            nf.free_gpus = [g for g in nf.free_gpus if g not in taken]
    return free


def place_gang(free: dict[str, NodeFree], req: Resources, replicas: int) -> tuple[Allocation, ...] | None:
    """Place all replicas or none, packed onto as few nodes as possible with best fit (see the module docstring).
    Mutates ``free`` only on success. A gang gets GPUs of one model."""
    if req.gpu > 0 and not req.gpu_model:
        models = sorted({d.model for nf in free.values() for d in nf.node.gpus})
        best = None
        for m in models:
            plan = _plan_simple(free, req.model_copy(update={"gpu_model": m}), replicas)
            if plan is not None and (best is None or len(plan[1]) < len(best[1])):
                best = (m, plan[1])
        if best is None:
            return None
        spec = req.model_copy(update={"gpu_model": best[0]})
        return _take_simple(free, spec, best[1], req)
    plan = _plan_simple(free, req, replicas)
    if plan is None:
        return None
    return _take_simple(free, req, plan[1], req)


def _plan_simple(
    free: dict[str, NodeFree], req: Resources, replicas: int
) -> tuple[None, list[tuple[NodeFree, int]]] | None:
    caps = [(nf, nf.replicas_fitting(req)) for nf in free.values()]
    caps = [(nf, c) for nf, c in caps if c > 0]
    out: list[tuple[NodeFree, int]] = []
    r = replicas
    while r > 0:
        whole = [(nf, c) for nf, c in caps if c >= r]
        if whole:
            nf, _ = min(whole, key=lambda t: (len(t[0]._usable(req)), t[0].cpu, t[0].node.name))
            out.append((nf, r))
            return None, out
        if not caps:
            return None
        nf, c = max(caps, key=lambda t: (t[1], -len(t[0]._usable(req))))
        out.append((nf, c))
        caps = [(x, k) for x, k in caps if x is not nf]
        r -= c
    return None, out


def _take_simple(
    free: dict[str, NodeFree], spec: Resources, plan: list[tuple[NodeFree, int]], orig: Resources
) -> tuple[Allocation, ...]:
    out = []
    for nf, k in plan:
        for _ in range(k):
            a = nf.take(spec)
            out.append(Allocation(a.node, a.gpus, orig.cpu, orig.memory_mib))
    return tuple(out)
