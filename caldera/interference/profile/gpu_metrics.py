"""GPU metrics of a profiled job, sampled while it runs: NVML's counters and, where the GPU has them, the
DCGM-style profiling fields through NVML's GPU Performance Monitoring (GPM, Hopper and newer).

=================  =========================================================================  ==================
column             what                                                                       source
=================  =========================================================================  ==================
``gpu_util``       % of time a kernel ran (``utilization.gpu``)                               NVML, every GPU
``mem_copy_util``  % of time device memory was read or written (``utilization.memory``)       NVML, every GPU
``pcie_tx/rx``     PCIe throughput, KB/s                                                      NVML, every GPU
``sm_active``      % of SMs busy (DCGM ``SM_ACTIVE``; ``NVML_GPM_METRIC_SM_UTIL``)              GPM (Hopper+)
``sm_occupancy``   % of warps resident vs the maximum (DCGM ``SM_OCCUPANCY``)                  GPM (Hopper+)
``dram_util``      % of peak DRAM bandwidth used (DCGM ``DRAM_ACTIVE``)                        GPM (Hopper+)
=================  =========================================================================  ==================

On an older GPU (no GPM) the last three stay empty ("not measured", never zero): DCGM's host engine would give them
there, and this version does not talk to DCGM. The NVML module is a parameter so tests can pass a fake one.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Sequence
from typing import Any

NVML_METRICS = ("gpu_util", "mem_copy_util", "pcie_tx", "pcie_rx")
GPM_METRICS = {  # column -> the NVML_GPM_METRIC_* constant's name
    "sm_active": "NVML_GPM_METRIC_SM_UTIL",
    "sm_occupancy": "NVML_GPM_METRIC_SM_OCCUPANCY",
    "dram_util": "NVML_GPM_METRIC_DRAM_BW_UTIL",
}
STATS = ("avg", "max", "std")


def stats(xs: Sequence[float]) -> dict[str, float]:
    return {"avg": statistics.fmean(xs), "max": max(xs), "std": statistics.pstdev(xs)} if xs else {}


def gpm_supported(nv: Any, handle: Any) -> bool:
    try:
        return bool(nv.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
    except Exception:  # noqa: BLE001 - an old driver or library without GPM: the fields stay empty
        return False


class GpuSampler(threading.Thread):
    """Samples device ``index`` every ``period_s`` until :attr:`stop` is set; :meth:`record` gives the columns."""

    def __init__(self, index: int, period_s: float = 0.1, nvml: Any = None) -> None:
        super().__init__(daemon=True)
        if nvml is None:
            import pynvml as nvml
        self.nv = nvml
        nvml.nvmlInit()
        self.h = nvml.nvmlDeviceGetHandleByIndex(index)
        self.period_s = period_s
        self.gpm = gpm_supported(nvml, self.h)
        self.samples: dict[str, list[float]] = {m: [] for m in (*NVML_METRICS, *(GPM_METRICS if self.gpm else ()))}
        self.stop = threading.Event()

    def run(self) -> None:
        nv = self.nv
        prev = nv.nvmlGpmSampleGet(self.h, nv.nvmlGpmSampleAlloc()) if self.gpm else None
        nxt = nv.nvmlGpmSampleAlloc() if self.gpm else None
        try:
            while not self.stop.wait(self.period_s):
                self._nvml_sample()
                if prev is not None:
                    nv.nvmlGpmSampleGet(self.h, nxt)
                    self._gpm_sample(prev, nxt)
                    prev, nxt = nxt, prev
        finally:
            for s in (prev, nxt):
                if s is not None:
                    nv.nvmlGpmSampleFree(s)

    def _nvml_sample(self) -> None:
        nv = self.nv
        u = nv.nvmlDeviceGetUtilizationRates(self.h)
        self.samples["gpu_util"].append(float(u.gpu))
        self.samples["mem_copy_util"].append(float(u.memory))
        self.samples["pcie_tx"].append(float(nv.nvmlDeviceGetPcieThroughput(self.h, nv.NVML_PCIE_UTIL_TX_BYTES)))
        self.samples["pcie_rx"].append(float(nv.nvmlDeviceGetPcieThroughput(self.h, nv.NVML_PCIE_UTIL_RX_BYTES)))

    def _gpm_sample(self, first: Any, second: Any) -> None:
        """The GPM metrics over the interval between two samples."""
        nv = self.nv
        req = nv.c_nvmlGpmMetricsGet_t()
        req.version = nv.NVML_GPM_METRICS_GET_VERSION
        req.numMetrics = len(GPM_METRICS)
        req.sample1, req.sample2 = first, second
        for i, const in enumerate(GPM_METRICS.values()):
            req.metrics[i].metricId = getattr(nv, const)
        nv.nvmlGpmMetricsGet(req)
        for i, column in enumerate(GPM_METRICS):
            if req.metrics[i].nvmlReturn == nv.NVML_SUCCESS:
                self.samples[column].append(float(req.metrics[i].value))

    def record(self) -> dict[str, float]:
        """``<metric>_avg/_max/_std`` for every metric sampled at least once."""
        return {f"{m}_{k}": v for m, xs in self.samples.items() for k, v in stats(xs).items()}
