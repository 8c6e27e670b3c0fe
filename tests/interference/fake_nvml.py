"""A fake NVML for the profilers' GPU metrics: the pynvml calls ``GpuSampler`` makes, with scripted answers."""

from __future__ import annotations

import time
from types import SimpleNamespace


class FakeNvml:
    """The pynvml calls the sampler makes, with scripted answers (GPM's metrics depend on the two samples)."""

    NVML_SUCCESS = 0
    NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES = 0, 1
    NVML_GPM_METRIC_SM_UTIL, NVML_GPM_METRIC_SM_OCCUPANCY, NVML_GPM_METRIC_DRAM_BW_UTIL = 2, 3, 10
    NVML_GPM_METRICS_GET_VERSION = 1

    def __init__(self, gpm: bool) -> None:
        self.gpm, self.ticks, self.freed, self.inited = gpm, 0, 0, False

    def nvmlInit(self) -> None:
        self.inited = True

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return f"gpu{i}"

    def nvmlDeviceGetUtilizationRates(self, h: str) -> SimpleNamespace:
        self.ticks += 1
        return SimpleNamespace(gpu=50 + 10 * (self.ticks % 2), memory=20)

    def nvmlDeviceGetPcieThroughput(self, h: str, counter: int) -> int:
        return 1000 if counter == self.NVML_PCIE_UTIL_TX_BYTES else 3000

    def nvmlGpmQueryDeviceSupport(self, h: str) -> SimpleNamespace:
        if not self.gpm:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return SimpleNamespace(isSupportedDevice=1)

    def nvmlGpmSampleAlloc(self) -> dict:
        return {}

    def nvmlGpmSampleGet(self, h: str, sample: dict) -> dict:
        sample["t"] = time.monotonic()
        return sample

    def nvmlGpmSampleFree(self, sample: dict) -> None:
        self.freed += 1

    def c_nvmlGpmMetricsGet_t(self) -> SimpleNamespace:
        return SimpleNamespace(metrics=[SimpleNamespace(metricId=None, value=0.0, nvmlReturn=None) for _ in range(8)])

    def nvmlGpmMetricsGet(self, req: SimpleNamespace) -> SimpleNamespace:
        assert req.version == 1 and req.sample2["t"] >= req.sample1["t"]  # an interval, in order
        values = {2: 80.0, 3: 40.0, 10: 65.0}
        for m in req.metrics[: req.numMetrics]:
            m.value, m.nvmlReturn = values[m.metricId], self.NVML_SUCCESS
        return req
