"""The simulated cluster: groups of identical nodes, turned into the scheduler's :class:`Node` list."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from caldera.core.cluster import Device, Node


@dataclass(slots=True, frozen=True)
class NodeGroup:
    count: int
    gpus: int
    gpu_model: str = "v100"
    cpu: float = 64.0
    memory_mib: int = 512 * 1024
    gpu_memory_mib: int = 32768
    prefix: str = "node"


@dataclass(slots=True)
class ClusterSpec:
    """Nodes to simulate. ``ClusterSpec.uniform(64, 8, "v100")`` is 64 nodes of 8 V100s."""

    groups: list[NodeGroup] = field(default_factory=list)

    @classmethod
    def uniform(
        cls,
        nodes: int,
        gpus_per_node: int = 8,
        gpu_model: str = "v100",
        cpu_per_node: float = 64.0,
        memory_mib_per_node: int = 512 * 1024,
    ) -> ClusterSpec:
        if nodes < 1 or gpus_per_node < 0:
            raise ValueError("need at least one node and a non-negative GPU count")
        return cls([NodeGroup(nodes, gpus_per_node, gpu_model.lower(), cpu_per_node, memory_mib_per_node)])

    @classmethod
    def parse(cls, text: str, cpu_per_node: float = 64.0, memory_mib_per_node: int = 512 * 1024) -> ClusterSpec:
        """``"64x8:v100"`` or several groups ``"32x8:v100,16x4:a100"`` (nodes x GPUs per node : model)."""
        groups = []
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            shape, _, model = part.partition(":")
            n, _, g = shape.lower().partition("x")
            groups.append(
                NodeGroup(
                    int(n),
                    int(g or 0),
                    (model or "v100").lower(),
                    cpu_per_node,
                    memory_mib_per_node,
                    prefix=f"{(model or 'v100').lower()}-g{len(groups)}",
                )
            )
        if not groups:
            raise ValueError(f"empty cluster spec {text!r}")
        return cls(groups)

    @classmethod
    def from_alibaba_nodes(cls, path: str | Path, gpu_only: bool = True) -> ClusterSpec:
        """The original openb cluster (1,213 GPU nodes, heterogeneous)."""
        from caldera.sim.traces import load_alibaba_nodes

        shapes: dict[tuple[int, str, float, int], int] = {}
        for n in load_alibaba_nodes(path):
            if gpu_only and n.gpus == 0:
                continue
            key = (n.gpus, n.model, n.cpu, n.memory_mib)
            shapes[key] = shapes.get(key, 0) + 1
        return cls(
            [
                NodeGroup(c, g, m, cpu, mem, prefix=f"{m}-{g}g-{i}")
                for i, ((g, m, cpu, mem), c) in enumerate(sorted(shapes.items()))
            ]
        )

    def build(self) -> list[Node]:
        nodes: list[Node] = []
        for gi, g in enumerate(self.groups):
            prefix = g.prefix if len(self.groups) == 1 or g.prefix != "node" else f"node-g{gi}"
            width = max(3, len(str(g.count - 1)))
            devs = tuple(Device(i, g.gpu_model, g.gpu_memory_mib) for i in range(g.gpus))
            for i in range(g.count):
                nodes.append(Node(f"{prefix}-{i:0{width}d}", g.cpu, g.memory_mib, devs))
        return nodes

    @property
    def total_gpus(self) -> int:
        return sum(g.count * g.gpus for g in self.groups)

    @property
    def num_nodes(self) -> int:
        return sum(g.count for g in self.groups)

    @property
    def max_gpus_per_node(self) -> int:
        return max((g.gpus for g in self.groups), default=0)

    def cpu_memory_per_gpu(self) -> tuple[float, int]:
        """The scarcest CPU and memory per GPU over GPU nodes: a job that asks for this much per GPU is never held
        back by CPU or memory, only by GPUs."""
        gpu_groups = [g for g in self.groups if g.gpus]
        if not gpu_groups:
            return 1.0, 1024
        return (min(g.cpu / g.gpus for g in gpu_groups), min(g.memory_mib // g.gpus for g in gpu_groups))

    def can_ever_fit(self, replicas: int, gpus: int, cpu: float, memory_mib: int, gpu_model: str | None) -> bool:
        """Whether the empty cluster could hold all replicas at once."""
        slots = 0
        for g in self.groups:
            if gpu_model and gpus and g.gpu_model != gpu_model:
                continue
            per_node = g.gpus // gpus if gpus else 10**9
            if cpu > 0:
                per_node = min(per_node, int(g.cpu // cpu + 1e-9))
            if memory_mib > 0:
                per_node = min(per_node, g.memory_mib // memory_mib)
            slots += per_node * g.count
            if slots >= replicas:
                return True
        return False

    def describe(self) -> str:
        return ", ".join(f"{g.count}x{g.gpus} {g.gpu_model}" for g in self.groups) + f" ({self.total_gpus} GPUs)"

    def to_dict(self) -> dict:
        return {
            "groups": [
                {"count": g.count, "gpus": g.gpus, "gpu_model": g.gpu_model, "cpu": g.cpu, "memory_mib": g.memory_mib}
                for g in self.groups
            ],
            "nodes": self.num_nodes,
            "total_gpus": self.total_gpus,
        }
