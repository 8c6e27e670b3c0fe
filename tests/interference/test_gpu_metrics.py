"""The profiler's GPU metrics (caldera/interference/profile/gpu_metrics.py) against a fake NVML: the NVML counters
on every GPU, the DCGM-style fields (SM active, SM occupancy, DRAM bandwidth) only where GPM answers. No GPU here:
the real pynvml path runs only on an accelerator."""

from __future__ import annotations

import time

import pytest

from caldera.interference.profile.gpu_metrics import GpuSampler
from caldera.interference.profile.harness import SOLO_COLUMNS
from tests.interference.fake_nvml import FakeNvml


def _sample(nv: FakeNvml) -> dict[str, float]:
    s = GpuSampler(0, period_s=0.01, nvml=nv)
    s.start()
    time.sleep(0.2)
    s.stop.set()
    s.join(5)
    return s.record()


def test_nvml_and_gpm_fields_are_sampled_into_the_solo_columns() -> None:
    nv = FakeNvml(gpm=True)
    rec = _sample(nv)
    assert nv.inited and nv.freed == 2  # both GPM samples released
    assert 50 <= rec["gpu_util_avg"] <= 60 and rec["gpu_util_max"] == 60 and rec["gpu_util_std"] > 0
    assert rec["mem_copy_util_avg"] == 20 and rec["pcie_tx_avg"] == 1000 and rec["pcie_rx_max"] == 3000
    assert rec["sm_active_avg"] == 80 and rec["sm_occupancy_max"] == 40 and rec["dram_util_avg"] == 65
    assert set(rec) <= set(SOLO_COLUMNS)  # every field lands in a column of the solo record


def test_without_gpm_the_dcgm_fields_stay_empty_not_zero() -> None:
    rec = _sample(FakeNvml(gpm=False))
    assert rec["gpu_util_avg"] > 0
    assert not any(k.startswith(("sm_active", "sm_occupancy", "dram_util")) for k in rec)


def test_the_real_nvml_path_needs_a_gpu() -> None:
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pytest.skip("no NVML driver on this host: the real GPU path is exercised on an accelerator only")
    if pynvml.nvmlDeviceGetCount() == 0:
        pytest.skip("no GPU")
    s = GpuSampler(0, period_s=0.05)
    s.start()
    time.sleep(0.3)
    s.stop.set()
    s.join(5)
    assert "gpu_util_avg" in s.record()
