"""GPUs as container devices: NVIDIA's CDI names when the host has a CDI spec (nvidia-ctk cdi generate), else the
device nodes themselves, else (declared fake GPUs on a CPU host, see caldera.runtime.local.gpus) nothing but the
CUDA_VISIBLE_DEVICES convention the local runtime uses."""

from __future__ import annotations

import glob
import os

_CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
_SHARED_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")


def _cdi_nvidia() -> bool:
    return any(glob.glob(f"{d}/nvidia*.yaml") or glob.glob(f"{d}/nvidia*.json") for d in _CDI_DIRS)


def device_args(indices: tuple[int, ...], real: bool) -> tuple[list[str], str]:
    """podman arguments giving a rank exactly ``indices``, and the CUDA_VISIBLE_DEVICES it should see."""
    if not indices:
        return [], ""
    if not real:
        return [], ",".join(map(str, indices))
    inside = ",".join(str(i) for i in range(len(indices)))  # the container sees only its own, numbered from 0
    if _cdi_nvidia():
        return [a for i in indices for a in ("--device", f"nvidia.com/gpu={i}")], inside
    nodes = [f"/dev/nvidia{i}" for i in indices] + [n for n in _SHARED_NODES if os.path.exists(n)]
    return [a for n in nodes for a in ("--device", n)], inside
