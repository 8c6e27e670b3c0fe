"""Right-sizing advice from a finished job's metrics, as a pure function: "asked for 4 GPUs and used 1", "peak GPU
memory 11 GiB of 80", "CPU-bound". Each piece is a code and its values; the portal says it in its reader's
language."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

GIB = 1024**3
USED_PERCENT = 10.0  # a GPU averaging under this over the run was not used
IDLE_PERCENT = 1.0  # all GPUs under this: the job did not need GPUs at all
SMALL_MEMORY = 0.5  # peak memory under this share of the GPU's: a shareable request would have fitted
CPU_BOUND_GPU_PERCENT = 30.0
CPU_BOUND_SHARE = 0.9  # of the cores it asked for
MIN_SAMPLES = 3


@dataclass(frozen=True)
class GpuUse:
    mean_percent: float
    peak_memory_bytes: float
    memory_total_bytes: float
    samples: int


@dataclass(frozen=True)
class JobUse:
    """A finished job's use of what it asked for: per GPU it held, and its CPU in cores (mean over the run)."""

    gpus_asked: int
    cpu_asked: float
    gpus: list[GpuUse] = field(default_factory=list)
    cpu_cores: float | None = None


@dataclass(frozen=True)
class Advice:
    code: str  # UnusedGpus, FewerGpus, SmallGpuMemory, CpuBound
    params: dict[str, Any]


def advise(use: JobUse) -> list[Advice]:
    measured = [g for g in use.gpus if g.samples >= MIN_SAMPLES]
    if use.gpus_asked == 0 or not measured or len(measured) < use.gpus_asked:
        return []  # no GPUs, or not enough data: no advice rather than a wrong one
    out = []
    used = [g for g in measured if g.mean_percent >= USED_PERCENT]
    mean = sum(g.mean_percent for g in measured) / len(measured)
    if all(g.mean_percent < IDLE_PERCENT for g in measured):
        out.append(Advice("UnusedGpus", {"asked": use.gpus_asked, "percent": round(mean, 1)}))
    elif len(used) < use.gpus_asked:
        out.append(Advice("FewerGpus", {"asked": use.gpus_asked, "used": max(1, len(used))}))
    peak = max(g.peak_memory_bytes for g in measured)
    total = max(g.memory_total_bytes for g in measured)
    if total and peak < SMALL_MEMORY * total:
        gib = {"peak_gib": round(peak / GIB, 1), "total_gib": round(total / GIB)}
        out.append(Advice("SmallGpuMemory", gib))
    cores = use.cpu_cores
    if (
        cores is not None
        and use.cpu_asked
        and mean < CPU_BOUND_GPU_PERCENT
        and cores >= CPU_BOUND_SHARE * use.cpu_asked
    ):
        values = {"gpu_percent": round(mean, 1), "cores": round(cores, 1), "asked": use.cpu_asked}
        out.append(Advice("CpuBound", values))
    return out


def applied(body: dict[str, Any], advice: list[dict[str, Any]]) -> dict[str, Any]:
    """A job's API body with its advice applied (the one-click resubmit): the GPUs it used, and a shareable request
    with its peak memory and a quarter more where one GPU's memory was mostly unused. A distributed job keeps its
    shape (its advice is for its author to read)."""
    out = {**body, "resources": dict(body.get("resources") or {})}
    if int(out.get("replicas", 1)) != 1:
        return out
    said = {a["code"]: a["params"] for a in advice}
    res = out["resources"]
    if "UnusedGpus" in said:
        res.pop("gpu", None)
        res.pop("gpu_memory_mib", None)
        out.pop("shareable", None)
        return out
    if "FewerGpus" in said:
        res["gpu"] = int(said["FewerGpus"]["used"])
    if "SmallGpuMemory" in said and res.get("gpu") == 1:
        out["shareable"] = True
        res["gpu_memory_mib"] = max(1024, math.ceil(said["SmallGpuMemory"]["peak_gib"] * 1.25 * 1024))
    return out
