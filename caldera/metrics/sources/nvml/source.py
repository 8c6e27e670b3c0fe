"""GPUs through NVML (pynvml, imported lazily): utilisation, memory, SM clock, power, temperature and each compute
process's GPU memory, so a sample is attributed by pid as well as by allocation."""

from __future__ import annotations

from typing import Any

from caldera.config import Settings
from caldera.metrics.sources.base import GpuSample, Holding, SourceUnavailable
from caldera.runtime.local.gpus import normalise_model


def _optional(call: Any, *args: Any) -> Any:
    """A field some devices do not report (power on some boards): None instead of failing the sample."""
    try:
        return call(*args)
    except Exception:  # noqa: BLE001 - NVMLError_NotSupported and friends
        return None


class NvmlSource:
    name = "nvml"

    def __init__(self, settings: Settings, nvml: Any = None) -> None:
        if nvml is None:
            try:
                import pynvml as nvml
            except ImportError as exc:
                raise SourceUnavailable("pynvml (nvidia-ml-py) is not installed") from exc
        try:
            nvml.nvmlInit()
            count = nvml.nvmlDeviceGetCount()
        except Exception as exc:  # noqa: BLE001 - NVMLError: no driver, no library
            raise SourceUnavailable(f"NVML: {exc}") from exc
        self.nv = nvml
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        self.models = [normalise_model(nvml.nvmlDeviceGetName(h)) for h in self.handles]

    def sample(self, holdings: list[Holding], at: float) -> list[GpuSample]:
        nv, out = self.nv, []
        for index, h in enumerate(self.handles):
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            power = _optional(nv.nvmlDeviceGetPowerUsage, h)
            procs = _optional(nv.nvmlDeviceGetComputeRunningProcesses, h) or []
            out.append(
                GpuSample(
                    gpu=index,
                    model=self.models[index],
                    at=at,
                    utilisation=float(nv.nvmlDeviceGetUtilizationRates(h).gpu),
                    memory_used=int(mem.used),
                    memory_total=int(mem.total),
                    sm_clock_mhz=_optional(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
                    power_w=None if power is None else power / 1000.0,
                    temperature_c=_optional(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
                    process_memory={int(p.pid): int(p.usedGpuMemory or 0) for p in procs},
                )
            )
        return out
