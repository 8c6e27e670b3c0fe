"""A fake pynvml for the NVML metric source: two devices, scripted load and compute processes."""

from __future__ import annotations

from types import SimpleNamespace


class FakeNvml:
    NVML_CLOCK_SM, NVML_TEMPERATURE_GPU = 1, 0

    def __init__(self, processes: dict[int, dict[int, int]]) -> None:
        self.processes = processes  # device -> pid -> bytes

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA A100-SXM4-80GB"

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(used=sum(self.processes.get(h, {}).values()), total=80 * 2**30)

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=90 if self.processes.get(h) else 0, memory=10)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        if h == 1:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return 250_000

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        return 1410

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        return 61

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[SimpleNamespace]:
        return [SimpleNamespace(pid=p, usedGpuMemory=m) for p, m in self.processes.get(h, {}).items()]
