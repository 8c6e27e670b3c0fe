"""What a job on a shared GPU is told, and what holds it to its GPU-memory request.

Two jobs the scheduler co-locates get the same device in ``CUDA_VISIBLE_DEVICES`` (every runtime hands out the
allocation's indices), so sharing itself needs nothing of a runtime. Holding each to its ``gpu_memory_mib``:

* ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (``0=<MiB>M,1=...``: each device the job sees) is enforced by the CUDA MPS
  server when an MPS control daemon serves the GPU (started by the admin; :func:`mps_running` looks for its pipe).
  Set in the job's environment, the job could change it before CUDA starts: a limit the job cannot lift needs the
  daemon's own default (``set_default_device_pinned_mem_limit``).
* Without MPS the cap is cooperative: ``CALDERA_GPU_MEMORY_FRACTION`` is the share of the device to pass to
  ``torch.cuda.set_per_process_memory_fraction`` (PyTorch reads no variable for it), and
  ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (unless the job sets its own) lowers fragmentation so two
  processes fit. Memory outside PyTorch's allocator (the CUDA context, cuDNN/cuBLAS workspaces) is not counted.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from caldera.core.cluster import Allocation, Node
from caldera.core.spec import JobSpec

MPS_PIPE_DEFAULT = "/tmp/nvidia-mps"


def mps_pipe_dir(env: dict[str, str] | None = None) -> Path | None:
    """The directory where an MPS control daemon listens (``CUDA_MPS_PIPE_DIRECTORY``, else /tmp/nvidia-mps, of
    the platform's environment); None when no daemon's ``control`` pipe is there."""
    pipe = Path((env or os.environ).get("CUDA_MPS_PIPE_DIRECTORY", MPS_PIPE_DEFAULT))
    return pipe.resolve() if (pipe / "control").exists() else None


def mps_running(env: dict[str, str] | None = None) -> bool:
    """Whether an MPS control daemon listens where CUDA clients look for it."""
    return mps_pipe_dir(env) is not None


def device_memory_mib(nodes: Iterable[Node], allocations: Iterable[Allocation]) -> int | None:
    """The memory of the smallest GPU a shared job was given; None when the nodes do not say."""
    mem = {(n.name, d.index): d.memory_mib for n in nodes for d in n.gpus}
    sizes = [m for a in allocations for g in a.gpus if (m := mem.get((a.node, g)))]
    return min(sizes) if sizes else None


def shared_gpu_env(spec: JobSpec, device_mib: int | None) -> dict[str, str]:
    """The variables a shareable job gets (empty for other jobs)."""
    mib = spec.resources.gpu_memory_mib
    if not spec.shareable or mib is None:
        return {}
    limit = ",".join(f"{i}={mib}M" for i in range(spec.resources.gpu))  # per GPU, as the request is
    env = {"CALDERA_GPU_MEMORY_MIB": str(mib), "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": limit}
    if device_mib:
        env["CALDERA_GPU_MEMORY_FRACTION"] = f"{min(1.0, mib / device_mib):.4f}"
    if "PYTORCH_CUDA_ALLOC_CONF" not in spec.env:
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    return env


# runtimes whose shareable jobs reach the host's MPS pipe (the container runtime mounts it read-only)
MPS_RUNTIMES = frozenset({"local", "container"})


def for_launch(
    spec: JobSpec, nodes: Iterable[Node], allocations: Iterable[Allocation], runtime: str
) -> tuple[dict[str, str], str]:
    """The shared job's variables, and for its Scheduled event how its GPU-memory request is held, said plainly
    (both empty for other jobs)."""
    allocations = list(allocations)
    env = shared_gpu_env(spec, device_memory_mib(nodes, allocations))
    if not env:
        return {}, ""
    mib = spec.resources.gpu_memory_mib
    if runtime in MPS_RUNTIMES and mps_running():
        return env, f"GPU memory {mib} MiB enforced by the CUDA MPS server"
    return env, (
        f"GPU memory {mib} MiB not enforced (no CUDA MPS here): cooperative, CALDERA_GPU_MEMORY_FRACTION for "
        "torch.cuda.set_per_process_memory_fraction"
    )
