"""Measure workloads alone and in 2- or 3-job mixes, and write the solo and co-located records.

Each measured job runs in a process of its own (spawned: a clean CUDA context and a true peak RSS). A mix's
processes start their timed loops together, each reports its speed once it has run ``seconds`` and ``min_iters``,
and keeps running until every member has reported, so nobody's tail runs alone. On a GPU each member of a mix gets
``torch.cuda.set_per_process_memory_fraction(1 / n)`` so no mix overflows the device.

Metrics: always speed (iterations/s), ``iter_avg_ms``, ``cpu_usage`` (percent of one core) and ``cpu_mem_max``
(peak RSS, MiB); on a GPU also ``gpu_mem_max`` (peak allocated by torch, MiB) and, sampled through NVML every 0.1 s,
``gpu_util_*`` (NVML utilisation.gpu), ``mem_copy_util_*`` (utilisation.memory), ``pcie_tx_*``/``pcie_rx_*``
(KB/s); ``sm_active_*``, ``sm_occupancy_*`` and ``dram_util_*`` (the DCGM profiling fields) where NVML's GPM has
them (Hopper and newer; :mod:`.gpu_metrics`). Empty means "not measured", never zero.
"""

from __future__ import annotations

import csv
import itertools
import multiprocessing as mp
import queue as queue_mod
import resource
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from caldera.interference.profile.gpu_metrics import GpuSampler

_STATS = ("avg", "max", "std")
_SAMPLED = ("gpu_util", "sm_active", "sm_occupancy", "mem_copy_util", "dram_util", "pcie_tx", "pcie_rx")
SOLO_COLUMNS = (
    ["model", "dataset", "gpu_num", "batchsize", "amp", "speed", "iter_avg_ms"]
    + [f"{m}_{s}" for m in _SAMPLED for s in _STATS]
    + ["gpu_mem_max", "cpu_mem_max", "cpu_usage", "gpu"]
)
COSUM_METRICS = ("gpu_util_avg", "sm_active_avg", "mem_copy_util_avg", "dram_util_avg", "gpu_mem_max", "cpu_usage")
COLOC_COLUMNS = [
    "mix", "n_jobs", "model", "dataset", "batchsize", "amp", "co_models", "speed", "co_speed", "decay",
    *(f"cosum_{m}" for m in COSUM_METRICS), "gpu",
]  # fmt: skip


@dataclass(slots=True, frozen=True)
class RunSpec:
    workload: str
    batch_size: int
    amp: bool = False

    @property
    def label(self) -> str:
        return f"{self.workload}@{self.batch_size}{'+amp' if self.amp else ''}"


@dataclass(slots=True, frozen=True)
class Limits:
    seconds: float = 5.0  # timed loop per measurement
    min_iters: int = 5
    warmup_iters: int = 2
    threads: int = 1  # torch CPU threads per process (a mix on a CPU otherwise oversubscribes the cores)
    width: int = 1  # model size multiplier (see zoo.build)


def device_name(device: str) -> str:
    """``cpu`` or the normalised model of the CUDA device (e.g. ``a100``)."""
    if not device.startswith("cuda"):
        return "cpu"
    import torch

    from caldera.runtime.local.gpus import normalise_model

    return normalise_model(torch.cuda.get_device_name(torch.device(device)))


def _worker(spec: RunSpec, device: str, lim: Limits, n_jobs: int, start: Any, done: Any, out: Any) -> None:
    """One measured process (also used alone for solo runs, ``n_jobs == 1``)."""
    try:
        out.put(_measure(spec, device, lim, n_jobs, start, done))
    except Exception as exc:  # reported to the parent, which names the workload
        out.put({"label": spec.label, "error": f"{type(exc).__name__}: {exc}"})


def _measure(spec: RunSpec, device: str, lim: Limits, n_jobs: int, start: Any, done: Any) -> dict[str, Any]:
    import torch

    from caldera.interference.profile.zoo import build

    torch.set_num_threads(lim.threads)
    torch.manual_seed(0)
    cuda = device.startswith("cuda")
    if cuda and n_jobs > 1:
        torch.cuda.set_per_process_memory_fraction(1.0 / n_jobs, torch.device(device))
    w = build(spec.workload, spec.batch_size, device, lim.width)
    opt = torch.optim.SGD(w.model.parameters(), lr=1e-3, momentum=0.9)
    scaler = torch.amp.GradScaler("cuda", enabled=cuda and spec.amp)
    amp_dtype = torch.float16 if cuda else torch.bfloat16

    def step() -> None:
        batch = w.batch()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda" if cuda else "cpu", dtype=amp_dtype, enabled=spec.amp):
            loss = w.loss(w.model, batch)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    for _ in range(lim.warmup_iters):
        step()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    sampler = GpuSampler(torch.device(device).index or 0) if cuda else None
    start.wait()
    if sampler:
        sampler.start()
    t0, c0 = time.perf_counter(), time.process_time()
    iters, speed, cpu = 0, None, 0.0
    while True:
        step()
        iters += 1
        if speed is None:
            if cuda:
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - t0
            if elapsed >= lim.seconds and iters >= lim.min_iters:
                speed, cpu = iters / elapsed, 100.0 * (time.process_time() - c0) / elapsed
                with done.get_lock():
                    done.value += 1
        if speed is not None and done.value >= n_jobs:
            break
    if sampler:
        sampler.stop.set()
        sampler.join()
    rec: dict[str, Any] = {
        "label": spec.label,
        "model": spec.workload,
        "dataset": w.dataset,
        "gpu_num": 1 if cuda else 0,
        "batchsize": spec.batch_size,
        "amp": int(spec.amp),
        "speed": speed,
        "iter_avg_ms": 1000.0 / speed,
        "cpu_usage": cpu,
        "cpu_mem_max": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "gpu_mem_max": torch.cuda.max_memory_allocated(torch.device(device)) / 2**20 if cuda else None,
        "gpu": device_name(device),
    }
    if sampler:
        rec.update(sampler.record())
    return rec


def run_group(specs: Sequence[RunSpec], device: str, lim: Limits, timeout_s: float = 600.0) -> list[dict[str, Any]]:
    """Run ``specs`` together (one process each) and return their records, in order."""
    ctx = mp.get_context("spawn")
    start, done, out = ctx.Event(), ctx.Value("i", 0), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(s, device, lim, len(specs), start, done, out)) for s in specs]
    for p in procs:
        p.start()
    start.set()  # each process waits for it after building its model and warming up
    results: dict[str, dict[str, Any]] = {}
    try:
        for _ in specs:
            r = out.get(timeout=timeout_s)
            results.setdefault(r["label"], r)
    except queue_mod.Empty:
        raise RuntimeError(f"profiling {[s.label for s in specs]} took over {timeout_s:.0f} s") from None
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    errors = [f"{r['label']}: {r['error']}" for r in results.values() if "error" in r]
    if errors:
        raise RuntimeError("; ".join(errors))
    return [results[s.label] for s in specs]


def coloc_rows(mix_id: int, solo: dict[str, dict[str, Any]], co: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One co-located record per member of a mix: its co_speed, decay and the co-runners' solo metrics summed."""
    rows = []
    for i, r in enumerate(co):
        mine, others = solo[r["label"]], [solo[o["label"]] for k, o in enumerate(co) if k != i]
        row = {
            "mix": mix_id,
            "n_jobs": len(co),
            "model": r["model"],
            "dataset": r["dataset"],
            "batchsize": r["batchsize"],
            "amp": r["amp"],
            "co_models": ";".join(o["label"] for o in others),
            "speed": mine["speed"],
            "co_speed": r["speed"],
            "decay": max(0.0, 1.0 - r["speed"] / mine["speed"]),
            "gpu": r["gpu"],
        }
        for m in COSUM_METRICS:
            vals = [o.get(m) for o in others]
            row[f"cosum_{m}"] = sum(vals) if all(v is not None for v in vals) else None  # type: ignore[misc]
        rows.append(row)
    return rows


def _write(path: Path, columns: Sequence[str], rows: Iterable[dict[str, Any]], mode: str = "w") -> None:
    """Rows as CSV with ``columns`` (a missing or None value is empty: not measured), the header when the file
    is new."""
    with path.open(mode, newline="") as f:
        wr = csv.DictWriter(f, columns, extrasaction="ignore")
        if f.tell() == 0:
            wr.writeheader()
        for r in rows:
            wr.writerow({c: "" if r.get(c) is None else r[c] for c in columns})


def append_records(path: Path, columns: Sequence[str], rows: Iterable[dict[str, Any]]) -> None:
    """Add rows to a record file, starting it with its header if it is new (the platform's own solo records)."""
    _write(path, columns, rows, mode="a")


def profile(
    specs: Sequence[RunSpec],
    out_dir: str | Path,
    *,
    device: str = "cpu",
    mix_sizes: Sequence[int] = (2,),
    max_mixes: int | None = None,
    limits: Limits = Limits(),
) -> tuple[Path, Path]:
    """Measure every spec alone, then mixes of ``mix_sizes`` (all combinations, at most ``max_mixes``); write
    ``solo.csv`` and ``coloc.csv`` in ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    solo = {s.label: run_group([s], device, limits)[0] for s in specs}
    mixes = [m for k in mix_sizes for m in itertools.combinations(specs, k)][:max_mixes]
    coloc = [row for i, mix in enumerate(mixes) for row in coloc_rows(i, solo, run_group(mix, device, limits))]
    _write(out / "solo.csv", SOLO_COLUMNS, solo.values())
    _write(out / "coloc.csv", COLOC_COLUMNS, coloc)
    return out / "solo.csv", out / "coloc.csv"
