"""GPU discovery: NVML when it works, else the GPUs the admin declared (``settings.fake_gpus``)."""

from __future__ import annotations

import logging
import re
from typing import Any

from caldera.config import Settings
from caldera.core.cluster import Device

log = logging.getLogger(__name__)

# words in NVML product names that say nothing about the model a user would ask for
_NOISE = {"nvidia", "tesla", "geforce", "quadro", "pcie", "sxm", "nvl", "nvlink", "generation", "gpu", "module"}
_NOISE_RE = re.compile(r"^(\d+gb|sxm\d*|hbm\d*e?|pcie\d*)$")


def normalise_model(name: str | bytes) -> str:
    """NVML product name -> short lower-case model key used in quotas and requests.

    "NVIDIA A100-SXM4-80GB" -> "a100", "NVIDIA H100 80GB HBM3" -> "h100", "Tesla V100-SXM2-32GB" -> "v100",
    "NVIDIA GeForce RTX 4090" -> "rtx4090", "NVIDIA RTX A6000" -> "a6000", "NVIDIA RTX 6000 Ada Generation" ->
    "rtx6000ada", "NVIDIA GeForce GTX 1080 Ti" -> "gtx1080ti".
    """
    if isinstance(name, bytes):
        name = name.decode(errors="replace")
    words = [w for w in re.split(r"[\s\-_/,()]+", name.lower()) if w]
    words = [w for w in words if w not in _NOISE and not _NOISE_RE.match(w)]
    # workstation Ampere cards are known by their number alone ("RTX A6000" -> "a6000")
    if len(words) >= 2 and words[0] == "rtx" and re.fullmatch(r"a\d+", words[1]):
        words = words[1:]
    return "".join(words) or "unknown"


def _nvml() -> Any:
    import pynvml  # from nvidia-ml-py; imported lazily so a host without it still starts

    return pynvml


def nvml_devices() -> tuple[Device, ...]:
    """GPUs NVML sees, indexed as CUDA does with CUDA_DEVICE_ORDER=PCI_BUS_ID. Empty when NVML is unusable."""
    try:
        nv = _nvml()
        nv.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - ImportError, NVMLError (no driver / library), OSError
        log.info("NVML unavailable (%s); using declared GPUs", exc)
        return ()
    try:
        out = []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            mem = nv.nvmlDeviceGetMemoryInfo(h).total // (1024 * 1024)
            out.append(Device(index=i, model=normalise_model(nv.nvmlDeviceGetName(h)), memory_mib=int(mem)))
        return tuple(out)
    except Exception as exc:  # noqa: BLE001
        log.warning("NVML device query failed (%s); using declared GPUs", exc)
        return ()
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def discover_gpus(settings: Settings) -> tuple[Device, ...]:
    found = nvml_devices()
    if found:
        return found
    return tuple(
        Device(index=i, model=g.model.lower(), memory_mib=g.memory_mib) for i, g in enumerate(settings.fake_gpus)
    )
