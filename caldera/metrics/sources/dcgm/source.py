"""GPUs read from a site's NVIDIA DCGM exporter (``metrics_dcgm_url``, its Prometheus text on :9400/metrics) instead
of NVML: the same series as the NVML source, and the DCGM profiling fields the interference model uses where the
exporter's counters include them. One HTTP read per round, time-boxed and size-capped; an exporter that is down or
answers garbage gives a round without GPU series (logged), never a stalled agent.

Only whole devices are read: a MIG instance's rows (``GPU_I_ID`` set) are not a device of the node's inventory."""

from __future__ import annotations

import logging
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from caldera.config import Settings
from caldera.metrics.sources.base import GpuSample, Holding, SourceUnavailable
from caldera.runtime.local.gpus import normalise_model

log = logging.getLogger(__name__)

MAX_SCRAPE_BYTES = 8 * 1024 * 1024
MIB = 1024 * 1024
# DCGM field -> the GpuSample attribute it fills (memory in MiB, turned into bytes below)
DEVICE_FIELDS = {
    "DCGM_FI_DEV_GPU_UTIL": "utilisation",
    "DCGM_FI_DEV_FB_USED": "memory_used",
    "DCGM_FI_DEV_FB_FREE": "memory_free",
    "DCGM_FI_DEV_FB_RESERVED": "memory_reserved",
    "DCGM_FI_DEV_SM_CLOCK": "sm_clock_mhz",
    "DCGM_FI_DEV_POWER_USAGE": "power_w",
    "DCGM_FI_DEV_GPU_TEMP": "temperature_c",
}
# DCGM profiling field -> the name the agent's caldera_gpu_profiling_ratio{field} and the interference model use
PROFILING_FIELDS = {
    "DCGM_FI_PROF_SM_ACTIVE": "sm_active",
    "DCGM_FI_PROF_SM_OCCUPANCY": "sm_occupancy",
    "DCGM_FI_PROF_DRAM_ACTIVE": "dram_active",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "gr_engine_active",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "tensor_active",
    "DCGM_FI_PROF_PCIE_TX_BYTES": "pcie_tx_bytes",
    "DCGM_FI_PROF_PCIE_RX_BYTES": "pcie_rx_bytes",
}


def parse(text: str, at: float) -> list[GpuSample]:
    """The exporter's scrape as one sample per whole device (by its ``gpu`` index); ValueError where unreadable."""
    fields: dict[int, dict[str, float]] = {}
    models: dict[int, str] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            name = DEVICE_FIELDS.get(s.name) or PROFILING_FIELDS.get(s.name)
            if name is None or s.labels.get("GPU_I_ID") or "gpu" not in s.labels:
                continue
            gpu = int(s.labels["gpu"])
            fields.setdefault(gpu, {})[name] = float(s.value)
            models.setdefault(gpu, normalise_model(s.labels.get("modelName", "")))
    out = []
    for gpu, f in sorted(fields.items()):
        if "utilisation" not in f or "memory_used" not in f:
            continue  # the exporter's counters lack what every view needs: not a device we can show
        used = int(f["memory_used"] * MIB)
        total = used + int((f.get("memory_free", 0.0) + f.get("memory_reserved", 0.0)) * MIB)
        out.append(
            GpuSample(
                gpu=gpu,
                model=models[gpu],
                at=at,
                utilisation=f["utilisation"],
                memory_used=used,
                memory_total=total,
                sm_clock_mhz=f.get("sm_clock_mhz"),
                power_w=f.get("power_w"),
                temperature_c=f.get("temperature_c"),
                profiling={v: f[v] for v in PROFILING_FIELDS.values() if v in f},
            )
        )
    return out


class DcgmSource:
    name = "dcgm"

    def __init__(self, settings: Settings) -> None:
        if not settings.metrics_dcgm_url:
            raise SourceUnavailable("no DCGM exporter named (setting metrics_dcgm_url)")
        self.url = settings.metrics_dcgm_url
        self.timeout_s = min(settings.prometheus_timeout_s, settings.metrics_interval_s)

    def sample(self, holdings: list[Holding], at: float) -> list[GpuSample]:
        try:
            with urllib.request.urlopen(self.url, timeout=self.timeout_s) as resp:  # noqa: S310 - the admin's URL
                text = resp.read(MAX_SCRAPE_BYTES + 1)[:MAX_SCRAPE_BYTES].decode()
            return parse(text, at)
        except (OSError, ValueError) as exc:  # refused, timed out, not the exporter's format
            log.warning("DCGM exporter at %s: %s", self.url, exc)
            return []
