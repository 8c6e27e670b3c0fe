"""Free capacity of the cluster and where a gang of replicas fits."""
from __future__ import annotations

from dataclasses import dataclass

from caldera.core.resources import Resources
from caldera.scheduler.snapshot import Allocation, Node, SchedJob


@dataclass(slots=True)
class NodeFree:
    node: Node
    cpu: float
    memory_mib: int
    free_gpus: list[int]          # device indices, ascending

    def fits(self, req: Resources) -> bool:
        if self.cpu + 1e-9 < req.cpu or self.memory_mib < req.memory_mib:
            return False
        if req.gpu == 0:
            return True
        if req.gpu_model:
            return sum(1 for i in self.free_gpus if self.node.gpus[i].model == req.gpu_model) >= req.gpu
        return len(self.free_gpus) >= req.gpu

    def take(self, req: Resources) -> Allocation:
        if req.gpu_model:
            picked = [i for i in self.free_gpus if self.node.gpus[i].model == req.gpu_model][: req.gpu]
        else:
            picked = self.free_gpus[: req.gpu]
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
    # device index -> position in node.gpus, in case indices are not 0..n-1
    for job in running:
        for a in job.allocations:
            nf = free.get(a.node)
            if nf is None:
                continue
            nf.cpu -= a.cpu
            nf.memory_mib -= a.memory_mib
            for g in a.gpus:
                if g in nf.free_gpus:
                    nf.free_gpus.remove(g)
    return free


def place_gang(free: dict[str, NodeFree], req: Resources, replicas: int) -> tuple[Allocation, ...] | None:
    """Place all replicas or none. Best fit: the node with the least room left that still fits goes first,
    so large free blocks stay whole for large jobs. Mutates ``free`` only on success."""
    taken: list[tuple[NodeFree, Allocation]] = []
    for _ in range(replicas):
        candidates = [nf for nf in free.values() if nf.fits(req)]
        if not candidates:
            for nf, a in taken:
                nf.give(a)
            return None
        best = min(candidates, key=lambda nf: (len(nf.free_gpus), nf.cpu, nf.node.name))
        taken.append((best, best.take(req)))
    return tuple(a for _, a in taken)
