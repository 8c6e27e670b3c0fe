"""GPU discovery and the node this host offers."""

from __future__ import annotations

import os
import socket
from types import SimpleNamespace

import pytest

from caldera.config import FakeGpu, Settings
from caldera.core.cluster import Device
from caldera.runtime.local import gpus
from caldera.runtime.local.gpus import normalise_model
from caldera.runtime.local.runtime import LocalRuntime


@pytest.mark.parametrize(
    "name, key",
    [
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA A100-PCIE-40GB", "a100"),
        ("NVIDIA A100 80GB PCIe", "a100"),
        ("NVIDIA H100 80GB HBM3", "h100"),
        ("NVIDIA H100 PCIe", "h100"),
        ("NVIDIA H100 NVL", "h100"),
        ("NVIDIA H200", "h200"),
        ("NVIDIA GH200 480GB", "gh200"),
        ("Tesla V100-SXM2-32GB", "v100"),
        ("Tesla V100-PCIE-16GB", "v100"),
        ("Tesla T4", "t4"),
        ("NVIDIA A10G", "a10g"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA GeForce RTX 4090", "rtx4090"),
        ("NVIDIA GeForce RTX 3090 Ti", "rtx3090ti"),
        ("NVIDIA GeForce GTX 1080 Ti", "gtx1080ti"),
        ("NVIDIA RTX A6000", "a6000"),
        ("NVIDIA RTX 6000 Ada Generation", "rtx6000ada"),
        ("Quadro RTX 8000", "rtx8000"),
        (b"NVIDIA B200", "b200"),  # older pynvml returns bytes
    ],
)
def test_model_names_are_normalised(name: str | bytes, key: str) -> None:
    assert normalise_model(name) == key


def _no_nvml() -> None:
    raise ImportError("No module named 'pynvml'")


def test_declared_gpus_when_nvml_is_absent(monkeypatch: pytest.MonkeyPatch, settings: Settings) -> None:
    monkeypatch.setattr(gpus, "_nvml", _no_nvml)
    [node] = LocalRuntime(settings).nodes()
    assert node.name == "testnode"
    assert node.gpus == (Device(0, "a100", 40960), Device(1, "a100", 40960))


def test_no_gpus_when_nvml_fails_and_none_declared(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    class Broken:
        class NVMLError(Exception):
            pass

        def nvmlInit(self) -> None:
            raise self.NVMLError("Driver Not Loaded")

    monkeypatch.setattr(gpus, "_nvml", lambda: Broken())
    [node] = LocalRuntime(Settings(data_dir=tmp_path)).nodes()
    assert node.gpus == ()


def _fake_pynvml(names: list[str], fail_at: int | None = None) -> SimpleNamespace:
    calls = {"shutdown": 0}

    def handle(i: int) -> int:
        if i == fail_at:
            raise RuntimeError("GPU is lost")
        return i

    return SimpleNamespace(
        calls=calls,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: calls.__setitem__("shutdown", calls["shutdown"] + 1),
        nvmlDeviceGetCount=lambda: len(names),
        nvmlDeviceGetHandleByIndex=handle,
        nvmlDeviceGetName=lambda h: names[h],
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=(80 + h) * 1024**3),
    )


def test_nvml_devices_are_used_when_found(monkeypatch: pytest.MonkeyPatch, settings: Settings) -> None:
    fake = _fake_pynvml(["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"])
    monkeypatch.setattr(gpus, "_nvml", lambda: fake)
    [node] = LocalRuntime(settings).nodes()
    # real GPUs win over the declared ones
    assert node.gpus == (Device(0, "h100", 80 * 1024), Device(1, "a100", 81 * 1024))
    assert fake.calls["shutdown"] == 1


def test_nvml_failing_mid_query_falls_back(monkeypatch: pytest.MonkeyPatch, settings: Settings) -> None:
    fake = _fake_pynvml(["NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"], fail_at=1)
    monkeypatch.setattr(gpus, "_nvml", lambda: fake)
    [node] = LocalRuntime(settings).nodes()
    assert [d.model for d in node.gpus] == ["a100", "a100"]
    assert fake.calls["shutdown"] == 1


def test_real_nvml_if_present() -> None:
    found = gpus.nvml_devices()  # must never raise, GPU or not
    if not found:
        pytest.skip("NVML finds no GPU on this host")
    assert [d.index for d in found] == list(range(len(found)))
    assert all(d.model and d.model == d.model.lower() and d.memory_mib > 0 for d in found)


def test_node_defaults_come_from_the_host(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setattr(gpus, "_nvml", _no_nvml)
    [node] = LocalRuntime(Settings(data_dir=tmp_path)).nodes()
    assert node.name == socket.gethostname()
    assert node.cpu == float(os.cpu_count())
    with open("/proc/meminfo") as f:
        total_kib = int(next(line for line in f if line.startswith("MemTotal:")).split()[1])
    assert node.memory_mib == total_kib // 1024


def test_node_settings_override_the_host(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setattr(gpus, "_nvml", _no_nvml)
    s = Settings(data_dir=tmp_path, node_name="gpu-07", node_cpu=12.5, node_memory_mib=65536, fake_gpus=[FakeGpu()])
    [node] = LocalRuntime(s).nodes()
    assert (node.name, node.cpu, node.memory_mib) == ("gpu-07", 12.5, 65536)
    assert node.gpus == (Device(0, "fake", 16384),)
