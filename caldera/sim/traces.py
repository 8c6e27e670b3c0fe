"""Trace loaders: Philly, Gavel (Philly-derived, per VC) and Alibaba PAI (cluster-trace-gpu-v2023), all yielding
:class:`TraceJob`.

Every loader returns jobs sorted by ``(submit_time_s, id)`` with ``submit_time_s`` relative to the trace's first
submission, so a trace always starts at 0. Data is read by path only (``Settings.traces_dir`` by default); nothing
is copied.

Gangs: a job asking for more GPUs than one node holds is split into node-sized replicas (:func:`split_gang`), which
is how a distributed job runs on the live system. Loaders split for ``gpus_per_node`` (8 unless told); the simulator
re-splits for the cluster it actually simulates.
"""

from __future__ import annotations

import ast
import csv
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from caldera.core.tenancy import PriorityClass

PHILLY_FILE = "philly_jobs.csv"
GAVEL_DIR = "gavel_msr_seed0"
ALIBABA_PODS = {
    "default": "alibaba_v2023_openb_pod_list_default.csv",
    "gpushare40": "alibaba_v2023_openb_pod_list_gpushare40.csv",
}
ALIBABA_NODES = "alibaba_v2023_openb_node_list_gpu_node.csv"
TRACE_NAMES = ("philly", "gavel", "alibaba", "alibaba-gpushare40")


@dataclass(slots=True)
class TraceJob:
    """One job of a trace, independent of the format it came from.

    ``num_gpus`` is the total; it always equals ``replicas * gpus_per_replica``. ``cpu``/``memory_mib`` are per
    replica and ``None`` when the trace does not say (the simulator then gives a share proportional to GPUs).
    ``duration_s`` is the run time with the whole allocation, excluding queueing.
    """

    id: str
    submit_time_s: float
    duration_s: float
    num_gpus: int
    account: str
    user: str
    priority: PriorityClass = PriorityClass.NORMAL
    gpu_model: str | None = None
    replicas: int = 1
    gpus_per_replica: int = 0
    cpu: float | None = None
    memory_mib: int | None = None
    # speed on each GPU type relative to the one ``duration_s`` holds for (Gavel: its measured throughputs), and
    # as ``<type>_unconsolidated`` when spread over more nodes than it needs; missing types run at 1
    speeds: dict[str, float] | None = None

    def __post_init__(self) -> None:
        if self.gpus_per_replica == 0 and self.num_gpus:
            self.replicas, self.gpus_per_replica = 1, self.num_gpus

    @property
    def gpu_seconds(self) -> float:
        return self.duration_s * self.num_gpus

    def split(self, gpus_per_node: int) -> TraceJob:
        """This job with its GPUs split into replicas of at most ``gpus_per_node`` (see :func:`split_gang`)."""
        r, g = split_gang(self.num_gpus, gpus_per_node)
        if (r, g) == (self.replicas, self.gpus_per_replica):
            return self
        return replace(self, replicas=r, gpus_per_replica=g)


def split_gang(num_gpus: int, gpus_per_node: int) -> tuple[int, int]:
    """``(replicas, gpus_per_replica)`` for a job of ``num_gpus``: one replica when it fits a node, else the fewest
    equal replicas of at most ``gpus_per_node`` GPUs that add up to exactly ``num_gpus`` (16 on 8-GPU nodes -> 2 x 8,
    12 -> 2 x 6, 24 -> 3 x 8). GPU-less jobs are one replica of 0 GPUs."""
    if num_gpus <= 0:
        return 1, 0
    if gpus_per_node <= 0 or num_gpus <= gpus_per_node:
        return 1, num_gpus
    r = math.ceil(num_gpus / gpus_per_node)
    while num_gpus % r:
        r += 1
    return r, num_gpus // r


def _finish(jobs: list[TraceJob], gpus_per_node: int | None, limit: int | None) -> list[TraceJob]:
    jobs.sort(key=lambda j: (j.submit_time_s, j.id))
    if limit is not None:
        jobs = jobs[:limit]
    if jobs:
        t0 = jobs[0].submit_time_s
        if t0:
            for j in jobs:
                j.submit_time_s -= t0
    if gpus_per_node:
        jobs = [j.split(gpus_per_node) for j in jobs]
    return jobs


def _account(name: str) -> str:
    """A queue-name-safe account name (``^[a-z0-9][a-z0-9._-]{0,62}$``)."""
    out = "".join(c if (c.isalnum() or c in "._-") else "-" for c in name.strip().lower())
    out = out.lstrip("._-")[:63]
    return out or "default"


# --------------------------------------------------------------------------------------------------- Philly
_EPOCH = datetime(1970, 1, 1)


def load_philly(path: str | Path, *, gpus_per_node: int | None = 8, limit: int | None = None) -> list[TraceJob]:
    """Microsoft Philly (``timestamp,duration,num_gpus,gpu_time,cluster``; timestamps ``YYYY-MM-DD HH:MM:SS``, not
    sorted in the file). Account = user = the ``cluster`` column (Philly's virtual cluster); times are relative to
    the earliest submission. ``limit`` keeps the first N jobs by submission time."""
    path = Path(path)
    jobs: list[TraceJob] = []
    parse = datetime.fromisoformat
    cache: dict[str, str] = {}
    with path.open(newline="") as f:
        rows = csv.reader(f)
        header = next(rows)
        ix = {name: i for i, name in enumerate(header)}
        i_ts, i_d, i_g, i_c = ix["timestamp"], ix["duration"], ix["num_gpus"], ix["cluster"]
        n = 0
        for row in rows:
            if not row:
                continue
            vc = row[i_c]
            acct = cache.get(vc)
            if acct is None:
                acct = cache[vc] = _account(vc)
            # naive wall-clock times, read as UTC so daylight-saving changes do not shift them
            jobs.append(
                TraceJob(
                    f"philly-{n}",
                    (parse(row[i_ts]) - _EPOCH).total_seconds(),
                    max(0.0, float(row[i_d])),
                    int(float(row[i_g])),
                    acct,
                    acct,
                )
            )
            n += 1
    return _finish(jobs, gpus_per_node, limit)


# --------------------------------------------------------------------------------------------------- Gavel
def load_gavel_throughputs(path: str | Path, gpu_type: str = "v100") -> dict[tuple[str, int], float]:
    """Solo throughputs (steps/s) per ``(job_type, scale_factor)`` on one GPU type, from Gavel's
    ``{gpu: {"('<job type>', sf)": {"null": solo, ...}}}``."""
    data = json.loads(Path(path).read_text())
    try:
        table = data[gpu_type]
    except KeyError:
        raise ValueError(f"no GPU type {gpu_type!r} in {path}; choose one of {', '.join(sorted(data))}") from None
    out: dict[tuple[str, int], float] = {}
    for key, entry in table.items():
        job_type, sf = ast.literal_eval(key)
        solo = entry.get("null") if isinstance(entry, dict) else None
        if solo:
            out[(job_type, int(sf))] = float(solo)
    return out


def load_gavel(
    path: str | Path,
    throughputs: str | Path,
    *,
    gpu_type: str = "v100",
    gpus_per_node: int | None = 8,
    limit: int | None = None,
    missing: str = "scale",
    stats: dict[str, int] | None = None,
) -> list[TraceJob]:
    """Gavel's Philly-derived traces: one tab-separated file per virtual cluster with ``job_type, command,
    num_steps_arg, needs_data_dir, total_steps, arrival_time_s, scale_factor``. ``path`` is one ``.trace`` file or a
    directory of them; account = user = the file stem. GPUs = ``scale_factor``; duration = ``total_steps`` / the solo
    throughput of ``(job_type, scale_factor)`` on ``gpu_type`` (Gavel's own model).

    Gavel measured no multi-GPU throughput for some types (A3C, CycleGAN, Recommendation) nor any for 32 GPUs, yet
    the traces ask for them. With ``missing="scale"`` (default) such a job's throughput is the largest measured
    smaller scale's, scaled linearly (an optimistic estimate), counted in ``stats["estimated"]``; with
    ``missing="skip"`` it is dropped, counted in ``stats["no_throughput"]``."""
    path = Path(path)
    files = sorted(path.glob("*.trace")) if path.is_dir() else [path]
    if not files:
        raise FileNotFoundError(f"no .trace files in {path}")
    tput = load_gavel_throughputs(throughputs, gpu_type)
    others = {g: load_gavel_throughputs(throughputs, g) for g in json.loads(Path(throughputs).read_text())}
    jobs: list[TraceJob] = []
    if missing not in ("scale", "skip"):
        raise ValueError("missing must be 'scale' or 'skip'")
    skipped = estimated = 0
    for file in files:
        acct = _account(file.stem)
        with file.open(newline="") as f:
            for n, row in enumerate(csv.reader(f, delimiter="\t")):
                if len(row) < 7:
                    continue
                job_type, total_steps, arrival, sf = row[0], float(row[4]), float(row[5]), int(float(row[6]))
                rate = tput.get((job_type, sf))
                measured = sf
                if not rate and missing == "scale":
                    base = max((k for k in range(1, sf) if tput.get((job_type, k))), default=None)
                    if base is not None:
                        rate = tput[(job_type, base)] * sf / base
                        measured = base
                        estimated += 1
                if not rate:
                    skipped += 1
                    continue
                job = TraceJob(f"{acct}-{n}", arrival, total_steps / rate, sf, acct, acct)
                job.speeds, runs_everywhere = _speeds(others, (job_type, measured), tput[(job_type, measured)])
                if not runs_everywhere:  # out of memory on some type: keep it on the one its duration is for
                    job.gpu_model = gpu_type
                jobs.append(job)
    if stats is not None:
        stats["no_throughput"] = skipped
        stats["estimated"] = estimated
    return _finish(jobs, gpus_per_node, limit)


def _speeds(tables: dict[str, dict[tuple[str, int], float]], key: tuple[str, int], ref: float):
    """``({GPU type: throughput / ref}, whether every type measured it as feasible)`` for one job type and
    scale: Gavel's 0.0 means out of memory on that type."""
    speeds = {}
    feasible = True
    for gpu, table in tables.items():
        rate = table.get(key)
        if rate:
            speeds[gpu] = rate / ref
        elif not gpu.endswith("_unconsolidated"):
            feasible = False
    return speeds, feasible


# --------------------------------------------------------------------------------------------------- Alibaba
_QOS_PRIORITY = {"be": PriorityClass.BEST_EFFORT}


def load_alibaba(
    path: str | Path,
    *,
    gpus_per_node: int | None = 8,
    limit: int | None = None,
    include_cpu_only: bool = False,
    include_unscheduled: bool = False,
    qos_priority: bool = True,
    use_trace_cpu_memory: bool = True,
    stats: dict[str, int] | None = None,
) -> list[TraceJob]:
    """Alibaba PAI ``openb`` pod list (``name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,
    creation_time,deletion_time,scheduled_time``; times in seconds).

    * Whole-GPU simulation: a pod sharing a GPU (``num_gpu == 1`` and ``gpu_milli < 1000``) is counted as one whole
      GPU, so GPU-sharing traces over-state demand (the simulator does not pack fractions).
    * submit = ``creation_time``; duration = ``deletion_time - scheduled_time`` (the time it actually held its
      resources). Pods never scheduled (``Pending``) did no work: skipped unless ``include_unscheduled``, in which
      case their duration is ``deletion_time - creation_time``.
    * GPU-less pods are skipped unless ``include_cpu_only``.
    * Account = user = the QoS class (``ls``, ``be``, ``burstable``, ``guaranteed``); with ``qos_priority`` the
      ``BE`` class runs as best-effort, everything else as normal.
    * ``gpu_spec`` is empty throughout openb, so ``gpu_model`` is set only when it is not.
    * Per-replica CPU (``cpu_milli / 1000``) and memory come from the pod when ``use_trace_cpu_memory`` (split
      evenly over replicas of a gang).

    Skips are counted in ``stats``.
    """
    jobs: list[TraceJob] = []
    skipped = {"cpu_only": 0, "unscheduled": 0}
    with Path(path).open(newline="") as f:
        for row in csv.DictReader(f):
            gpus = int(row["num_gpu"] or 0)
            if gpus == 0 and not include_cpu_only:
                skipped["cpu_only"] += 1
                continue
            created = float(row["creation_time"])
            deleted = float(row["deletion_time"])
            sched = row.get("scheduled_time") or ""
            if sched == "":
                if not include_unscheduled:
                    skipped["unscheduled"] += 1
                    continue
                start = created
            else:
                start = float(sched)
            qos = row.get("qos") or "default"
            acct = _account(qos)
            spec = (row.get("gpu_spec") or "").strip().lower() or None
            prio = _QOS_PRIORITY.get(acct, PriorityClass.NORMAL) if qos_priority else PriorityClass.NORMAL
            job = TraceJob(row["name"], created, max(0.0, deleted - start), gpus, acct, acct, prio, spec)
            if use_trace_cpu_memory:
                job.cpu = float(row["cpu_milli"]) / 1000.0
                job.memory_mib = int(float(row["memory_mib"]))
            jobs.append(job)
    if stats is not None:
        stats.update(skipped)
    jobs = _finish(jobs, None, limit)
    if gpus_per_node:
        out = []
        for j in jobs:
            s = j.split(gpus_per_node)
            if s is not j and s.cpu is not None:
                s.cpu = s.cpu / s.replicas
                s.memory_mib = (s.memory_mib or 0) // s.replicas
            out.append(s)
        jobs = out
    return jobs


@dataclass(slots=True, frozen=True)
class TraceNode:
    name: str
    cpu: float
    memory_mib: int
    gpus: int
    model: str


def load_alibaba_nodes(path: str | Path) -> list[TraceNode]:
    """The openb GPU node list (``sn,cpu_milli,memory_mib,gpu,model``), for simulating the original cluster."""
    with Path(path).open(newline="") as f:
        return [
            TraceNode(
                r["sn"],
                float(r["cpu_milli"]) / 1000.0,
                int(float(r["memory_mib"])),
                int(r["gpu"]),
                r["model"].strip().lower(),
            )
            for r in csv.DictReader(f)
        ]


# --------------------------------------------------------------------------------------------------- by name
def _default_traces_dir() -> Path:
    from caldera.config import Settings

    return Path(Settings().traces_dir)


def trace_path(name: str, traces_dir: str | Path | None = None) -> Path:
    """The file (or directory) a named trace is read from."""
    base = Path(traces_dir) if traces_dir else _default_traces_dir()
    if name == "philly":
        return base / PHILLY_FILE
    if name == "gavel":
        return base / GAVEL_DIR
    if name == "alibaba":
        return base / ALIBABA_PODS["default"]
    if name.startswith("alibaba-"):
        key = name.split("-", 1)[1]
        if key in ALIBABA_PODS:
            return base / ALIBABA_PODS[key]
    raise ValueError(f"unknown trace {name!r}; choose one of {', '.join(TRACE_NAMES)} or give a path")


def load_trace(
    trace: str | Path,
    *,
    traces_dir: str | Path | None = None,
    gpus_per_node: int | None = 8,
    limit: int | None = None,
    gpu_type: str = "v100",
    throughputs: str | Path | None = None,
    **options,
) -> list[TraceJob]:
    """Load a trace by name (``philly``, ``gavel``, ``alibaba``, ``alibaba-gpushare40``) from ``traces_dir``, or
    by path (format guessed: a directory or ``.trace`` file is Gavel, a CSV with a ``cluster`` column is Philly, one
    with ``num_gpu`` is Alibaba). Extra ``options`` go to the format's loader."""
    s = str(trace)
    if s in TRACE_NAMES or s.startswith("alibaba-"):
        path, kind = trace_path(s, traces_dir), s.split("-")[0]
    else:
        path = Path(s)
        if not path.exists():
            raise FileNotFoundError(f"no trace {s!r}: not a known name ({', '.join(TRACE_NAMES)}) nor a file")
        if path.is_dir() or path.suffix == ".trace":
            kind = "gavel"
        else:
            with path.open() as f:
                header = f.readline().strip().split(",")
            if "cluster" in header:
                kind = "philly"
            elif "num_gpu" in header:
                kind = "alibaba"
            else:
                raise ValueError(f"cannot tell the format of {path} from its header {header}")
    if kind != "gavel" and "missing" in options:
        raise ValueError("skipping jobs without measured throughputs applies to Gavel's traces only")
    if kind == "philly":
        return load_philly(path, gpus_per_node=gpus_per_node, limit=limit)
    if kind == "gavel":
        if throughputs is None:
            base = Path(traces_dir) if traces_dir else _default_traces_dir()
            throughputs = base.parent / "colocation" / "gavel_simulation_throughputs.json"
        if not Path(throughputs).is_file():
            raise FileNotFoundError(
                f"Gavel's throughputs file {throughputs} is missing: a Gavel trace needs it to turn steps into run "
                "times; pass its path (--throughputs), or put it at ../shared/data/colocation/"
            )
        return load_gavel(path, throughputs, gpu_type=gpu_type, gpus_per_node=gpus_per_node, limit=limit, **options)
    return load_alibaba(path, gpus_per_node=gpus_per_node, limit=limit, **options)


def summarize(jobs: Iterable[TraceJob]) -> dict[str, object]:
    """Counts and ranges, for ``caldera sim info`` and sanity checks."""
    jobs = list(jobs)
    if not jobs:
        return {"jobs": 0}
    accounts: dict[str, int] = {}
    for j in jobs:
        accounts[j.account] = accounts.get(j.account, 0) + 1
    span = max(j.submit_time_s for j in jobs)
    gpu_s = sum(j.gpu_seconds for j in jobs)
    return {
        "jobs": len(jobs),
        "accounts": len(accounts),
        "jobs_per_account": dict(sorted(accounts.items(), key=lambda kv: -kv[1])),
        "submit_span_s": span,
        "duration_s": {
            "min": min(j.duration_s for j in jobs),
            "max": max(j.duration_s for j in jobs),
            "mean": sum(j.duration_s for j in jobs) / len(jobs),
        },
        "gpus": {"min": min(j.num_gpus for j in jobs), "max": max(j.num_gpus for j in jobs)},
        "gpu_seconds": gpu_s,
        "mean_gpu_demand": gpu_s / span if span else None,
    }
