"""What the metrics views show (cluster, node, job, idle GPUs, GPU-hours), read from Prometheus with PromQL on every
request: the platform keeps no copy. Each function takes a ``Prometheus`` client and raises ``MetricsUnavailable``
at its first query that fails, so a view costs at most one time-out.

Visibility is the caller's to decide and is passed in as ``user``: ``None`` reads every job's series (an admin),
a name restricts job series to that user's; cluster totals carry no job and are read by everyone."""

from __future__ import annotations

import math
import re
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

from caldera.metrics.query import MetricsUnavailable, Prometheus

POINTS = 240  # points per series on a chart: a 30-day chart steps by 3 hours
COMPUTING_ABOVE_PERCENT = 5.0  # a GPU above this utilisation computes; a held one at or below it idles
IDLE_WINDOW_S = 3600  # the window over which the top idle holders are ranked
TOP_IDLE = 10
DAY_S = 86400
BY = ("user", "account", "queue")

JOB_GPU = "caldera_job_gpu_utilisation_percent"
JOB_GPU_MEM = "caldera_job_gpu_memory_used_bytes"
GPU = "caldera_gpu_utilisation_percent"
GPU_MEM = "caldera_gpu_memory_used_bytes"
GPU_MEM_TOTAL = "caldera_gpu_memory_total_bytes"


def quoted(value: str) -> str:
    """A PromQL string literal: the value is data, never part of the query."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def selector(**labels: str | list[str] | None) -> str:
    """``{a="x",b=~"y|z"}`` of the labels that are set (None: any value; a list: any of its values, each escaped:
    the names are data in the regular expression too)."""

    def matcher(k: str, v: str | list[str]) -> str:
        return f"{k}={quoted(v)}" if isinstance(v, str) else f"{k}=~{quoted('|'.join(map(re.escape, v)))}"

    return "{" + ",".join(matcher(k, v) for k, v in labels.items() if v is not None) + "}"


_SINCE = re.compile(r"^(\d{1,6})([mhdw])$")
_UNIT_S = {"m": 60, "h": 3600, "d": DAY_S, "w": 7 * DAY_S}


def parse_since(since: str, now: float) -> float:
    """``7d``, ``12h``, ``30m``, ``2w`` before ``now``, or a UTC date ``2026-12-01``; ValueError otherwise."""
    m = _SINCE.match(since.strip())
    if m:
        return now - int(m.group(1)) * _UNIT_S[m.group(2)]
    try:
        return datetime.strptime(since.strip(), "%Y-%m-%d").replace(tzinfo=UTC).timestamp()
    except ValueError:
        raise ValueError(f"{since!r} is neither a duration (7d, 12h, 30m, 2w) nor a date (2026-12-01)") from None


def window(start: float, end: float, floor_s: float) -> tuple[float, float, float]:
    """(start, end, step) for a chart: about POINTS points, the step a whole number of seconds no finer than the
    scrape interval, counted back from ``end`` so that the last point is now (a point later than Prometheus'
    5-minute look-back past the newest sample would be empty)."""
    step = float(max(math.ceil(floor_s), math.ceil((end - start) / POINTS)))
    return end - math.ceil((end - start) / step) * step, end, step


def _number(v: object) -> float | None:
    x = float(v)  # type: ignore[arg-type]
    return None if math.isnan(x) or math.isinf(x) else x


def series(result: list[dict], key: tuple[str, ...]) -> list[dict]:
    """A range query's answer as ``[{"labels": {k: ...}, "points": [[t, v], ...]}]``, sorted by the ``key`` labels."""
    try:
        out = [
            {
                "labels": {k: r["metric"].get(k, "") for k in key},
                "points": [[float(t), _number(v)] for t, v in r["values"]],
            }
            for r in result
        ]
    except (KeyError, TypeError, ValueError) as exc:
        raise MetricsUnavailable(f"Prometheus answered an unreadable series: {exc}") from exc
    return sorted(out, key=lambda s: tuple(_natural(s["labels"][k]) for k in key))


def _natural(text: str) -> tuple[int, str]:
    return (int(text), "") if text.isdigit() else (1 << 30, text)


def values(result: list[dict], key: tuple[str, ...]) -> list[tuple[dict, float]]:
    """An instant query's answer as (labels, value) pairs."""
    try:
        return [({k: r["metric"].get(k, "") for k in key}, float(r["value"][1])) for r in result]
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise MetricsUnavailable(f"Prometheus answered an unreadable value: {exc}") from exc


def ranges(prom: Prometheus, queries: dict[str, str], start: float, end: float, step: float) -> dict[str, list]:
    """Range queries sent together (Prometheus answers them in parallel): a view waits for the slowest, not the sum."""
    with ThreadPoolExecutor(max_workers=len(queries)) as pool:
        futures = {name: pool.submit(prom.range, promql, start, end, step) for name, promql in queries.items()}
        return {name: f.result() for name, f in futures.items()}


HELD = f"max by (node, gpu, gpu_model) ({JOB_GPU})"
# the cluster chart's series: name -> (its recording rule's series, PromQL); RULES records each of them
CLUSTER_SERIES = {
    "total": ("gpu_model:caldera_gpus_total:count", f"count by (gpu_model) ({GPU})"),
    "allocated": ("gpu_model:caldera_gpus_allocated:count", f"count by (gpu_model) ({HELD})"),
    "computing": (
        "gpu_model:caldera_gpus_computing:count",
        f"count by (gpu_model) ({GPU} > {COMPUTING_ABOVE_PERCENT})",
    ),
    "idle": ("gpu_model:caldera_gpus_idle:count", f"count by (gpu_model) ({HELD} <= {COMPUTING_ABOVE_PERCENT})"),
    "down": ("gpu_model:caldera_gpus_down:sum", "sum by (gpu_model) (caldera_gpus_down)"),
    "mean all": ("caldera:gpu_utilisation_percent:avg", f"avg({GPU})"),
    "mean allocated": ("caldera:gpu_utilisation_percent_held:avg", f"avg({HELD})"),
    "waiting": ("queue:caldera_queue_waiting_jobs:max", "max by (queue) (caldera_queue_waiting_jobs)"),
    "oldest_wait_s": (
        "queue:caldera_queue_oldest_wait_seconds:max",
        "max by (queue) (caldera_queue_oldest_wait_seconds)",
    ),
}
GPU_COUNTS = ("total", "allocated", "computing", "idle", "down")
MEANS = ("all", "allocated")
QUEUE_SERIES = ("waiting", "oldest_wait_s")
RULES = dict(CLUSTER_SERIES.values())
# ranges at least this long read the recorded series: a 30-day chart then reads a few series per model instead of
# every GPU's and every job's (docs/metrics.md, Figures)
RECORDED_FROM_S = 2 * DAY_S


def cluster(prom: Prometheus, start: float, end: float, interval_s: float, user: str | None) -> dict:
    """GPUs per model over time: in all, allocated (a job holds it), computing (above COMPUTING_ABOVE_PERCENT) and
    idle (held and not computing); the average utilisation of all GPUs and of the held ones; the jobs holding GPUs
    with the least utilisation over the last hour (only ``user``'s unless None).

    A range of RECORDED_FROM_S or more reads the recorded series (``RULES``); where they are missing (a site's
    Prometheus without the rules) it reads the raw series as a shorter range does."""
    long_range = end - start >= RECORDED_FROM_S
    start, end, step = window(start, end, interval_s)
    with ThreadPoolExecutor(max_workers=2) as pool:
        holders = pool.submit(idle_holders, prom, end, user)
        waits = pool.submit(queue_waits_now, prom, end)
        found = recorded_ranges(prom, start, end, step) if long_range else {}
        recorded = bool(found.get("total"))
        if not recorded:
            found = ranges(prom, {name: promql for name, (_, promql) in CLUSTER_SERIES.items()}, start, end, step)
        idle, now = holders.result(), waits.result()

    def by(label: str, names: tuple[str, ...]) -> dict[str, dict[str, list]]:
        out: dict[str, dict[str, list]] = {}
        for name in names:
            for s in series(found[name], (label,)):
                out.setdefault(s["labels"][label], {})[name] = s["points"]
        return out

    models, queues = by("gpu_model", GPU_COUNTS), by("queue", QUEUE_SERIES)
    return {
        "start": start,
        "end": end,
        "step": step,
        "recorded": recorded,
        "models": [{"model": m, **{k: v.get(k, []) for k in GPU_COUNTS}} for m, v in sorted(models.items())],
        "utilisation": {k: next(iter(series(found[f"mean {k}"], ())), {"points": []})["points"] for k in MEANS},
        "queues": [
            {"queue": q, **{k: v.get(k, []) for k in QUEUE_SERIES}, **now.get(q, {"started": 0, "wait_s": {}})}
            for q, v in sorted(queues.items())
        ],
        "idle_holders": idle,
    }


def recorded_ranges(prom: Prometheus, start: float, end: float, step: float) -> dict[str, list]:
    """Every recorded cluster series in one range query, by the cluster series' names: one look-up per TSDB block
    rather than one per series (on a loaded machine this halved the 30-day chart; docs/metrics.md, Figures)."""
    name_of = {recorded: name for name, (recorded, _) in CLUSTER_SERIES.items()}
    found: dict[str, list] = {name: [] for name in CLUSTER_SERIES}
    for r in prom.range(f'{{__name__=~"{"|".join(name_of)}"}}', start, end, step):
        name = name_of.get(r["metric"].get("__name__", ""))
        if name is not None:
            found[name].append(r)
    return found


def queue_waits_now(prom: Prometheus, at: float) -> dict[str, dict]:
    """Per queue: how many jobs started within the agent's window, and the quantiles of their waits (seconds)."""
    out: dict[str, dict] = {}
    for labels, n in values(prom.instant("max by (queue) (caldera_queue_started_jobs)", at), ("queue",)):
        out[labels["queue"]] = {"started": int(n), "wait_s": {}}
    quantiles = prom.instant("max by (queue, quantile) (caldera_queue_wait_seconds)", at)
    for labels, v in values(quantiles, ("queue", "quantile")):
        out.setdefault(labels["queue"], {"started": 0, "wait_s": {}})["wait_s"][labels["quantile"]] = v
    return out


def idle_holders(prom: Prometheus, at: float, user: str | None) -> list[dict]:
    sel = selector(user=user)
    key = ("job", "user", "account", "queue")
    over = f"avg_over_time({JOB_GPU}{sel}[{IDLE_WINDOW_S}s])"
    means = values(prom.instant(f"bottomk({TOP_IDLE}, avg by (job, user, account, queue) ({over}))", at), key)
    gpus = {
        labels["job"]: int(n)
        for labels, n in values(prom.instant(f"count by (job, user, account, queue) ({over})", at), key)
    }
    rows = [{**labels, "gpus": gpus.get(labels["job"], 0), "mean_percent": mean} for labels, mean in means]
    return sorted(rows, key=lambda r: (r["mean_percent"], -r["gpus"], r["job"]))


def node(prom: Prometheus, name: str, start: float, end: float, interval_s: float) -> dict:
    """Each device of a node over time (utilisation, memory used) and which job held it when (all jobs: admins)."""
    start, end, step = window(start, end, interval_s)
    sel = selector(node=name)
    key = ("gpu", "gpu_model")
    found = ranges(
        prom,
        {"util": f"{GPU}{sel}", "mem": f"{GPU_MEM}{sel}", "held": f"count by (gpu, job, user) ({JOB_GPU}{sel})"},
        start,
        end,
        step,
    )
    util, mem = series(found["util"], key), series(found["mem"], key)
    total = {
        labels["gpu"]: v for labels, v in values(prom.instant(f"max_over_time({GPU_MEM_TOTAL}{sel}[1d])", end), key)
    }
    held = series(found["held"], ("gpu", "job", "user"))
    holders = [
        {**s["labels"], "from": a, "to": b}
        for s in held
        for a, b in spans([t for t, v in s["points"] if v is not None], step)
    ]
    memory = {s["labels"]["gpu"]: s["points"] for s in mem}
    return {
        "node": name,
        "start": start,
        "end": end,
        "step": step,
        "gpus": [
            {
                "gpu": s["labels"]["gpu"],
                "model": s["labels"]["gpu_model"],
                "memory_total_bytes": total.get(s["labels"]["gpu"]),
                "utilisation": s["points"],
                "memory_used_bytes": memory.get(s["labels"]["gpu"], []),
            }
            for s in util
        ],
        "holders": sorted(holders, key=lambda h: (_natural(h["gpu"]), h["from"])),
    }


def spans(times: list[float], step: float) -> list[tuple[float, float]]:
    """Contiguous runs of chart times (a gap longer than a step ends one) as (first, last)."""
    out: list[tuple[float, float]] = []
    for t in sorted(times):
        if out and t - out[-1][1] <= step * 1.5:
            out[-1] = (out[-1][0], t)
        else:
            out.append((t, t))
    return out


def job(prom: Prometheus, job_id: str, replicas: list[tuple[str, tuple[int, ...]]], start: float, end: float,
        interval_s: float) -> dict:  # fmt: skip
    """A job's series over its lifetime: per GPU (named by the replica that held it, from ``replicas``: each
    replica's node and GPUs) utilisation and memory; per node CPU (cores, from the CPU-seconds counter) and memory."""
    start, end, step = window(start, end, interval_s)
    sel = selector(job=job_id)
    gpu_key, node_key = ("node", "gpu"), ("node",)
    rate_window = int(max(step, 3 * interval_s))
    replica_of = {(n, str(g)): r for r, (n, gpus) in enumerate(replicas) for g in gpus}

    found = ranges(
        prom,
        {
            "gpu_utilisation": f"max by (node, gpu) ({JOB_GPU}{sel})",
            "gpu_memory_bytes": f"max by (node, gpu) ({JOB_GPU_MEM}{sel})",
            "cpu_cores": f"sum by (node) (rate(caldera_job_cpu_seconds{sel}[{rate_window}s]))",
            "memory_bytes": f"sum by (node) (caldera_job_memory_bytes{sel})",
        },
        start,
        end,
        step,
    )

    def per_gpu(name: str) -> list[dict]:
        return [
            {**s["labels"], "replica": replica_of.get((s["labels"]["node"], s["labels"]["gpu"])), "points": s["points"]}
            for s in series(found[name], gpu_key)
        ]

    def per_node(name: str) -> list[dict]:
        return [{**s["labels"], "points": s["points"]} for s in series(found[name], node_key)]

    return {
        "start": start,
        "end": end,
        "step": step,
        "gpu_utilisation": per_gpu("gpu_utilisation"),
        "gpu_memory_bytes": per_gpu("gpu_memory_bytes"),
        "cpu_cores": per_node("cpu_cores"),
        "memory_bytes": per_node("memory_bytes"),
    }


def allocated_now(prom: Prometheus, at: float, window_s: int, user: str | None) -> dict:
    """The GPUs jobs hold now with their mean utilisation over ``window_s`` (only ``user``'s unless None), and per
    model the mean of all held GPUs (a cluster total)."""
    key = ("node", "gpu", "gpu_model", "job", "user")
    mine = f"avg_over_time({JOB_GPU}{selector(user=user)}[{int(window_s)}s])"
    every = f"avg_over_time({JOB_GPU}[{int(window_s)}s])"
    rows = [
        {**labels, "mean_percent": v}
        for labels, v in values(prom.instant(f"max by ({', '.join(key)}) ({mine})", at), key)
    ]
    held = prom.instant(f"avg by (gpu_model) (max by (node, gpu, gpu_model) ({every}))", at)
    models = [{"model": labels["gpu_model"], "mean_percent": v} for labels, v in values(held, ("gpu_model",))]
    return {
        "gpus": sorted(rows, key=lambda r: (r["node"], _natural(r["gpu"]))),
        "models": sorted(models, key=lambda m: m["model"]),
    }


def gpu_hours(
    prom: Prometheus,
    start: float,
    end: float,
    by: str,
    interval_s: float,
    user: str | None,
    accounts: list[str] | None = None,
) -> list[dict]:
    """GPU-hours per UTC day and per ``by`` (user, account or queue): allocated (every sample of a GPU a job held
    counts one scrape interval) and used (the same, weighted by its utilisation). Only ``user``'s jobs unless None,
    and only the jobs of ``accounts`` unless None."""
    if by not in BY:
        raise ValueError(f"by: one of {', '.join(BY)}")
    first_day = math.floor(start / DAY_S) * DAY_S
    last_day = math.floor(end / DAY_S) * DAY_S
    sel = selector(user=user, account=accounts)
    hours = f"{float(interval_s)} / 3600"
    queries = {
        "allocated_gpu_hours": f"sum by ({by}) (count_over_time({JOB_GPU}{sel}[1d])) * {hours}",
        "used_gpu_hours": f"sum by ({by}) (sum_over_time({JOB_GPU}{sel}[1d])) / 100 * {hours}",
    }
    rows: dict[tuple[str, str], dict] = {}
    for name, promql in queries.items():
        # evaluated at each day's end (the last one in the future is fine): the [1d] window is that day
        for s in series(prom.range(promql, first_day + DAY_S, last_day + DAY_S, DAY_S), (by,)):
            for t, v in s["points"]:
                day = datetime.fromtimestamp(t - DAY_S, UTC).strftime("%Y-%m-%d")
                row = rows.setdefault((day, s["labels"][by]), {"day": day, by: s["labels"][by]})
                row[name] = round(v or 0.0, 6)
    out = [{"allocated_gpu_hours": 0.0, "used_gpu_hours": 0.0, **r} for r in rows.values()]
    return sorted(out, key=lambda r: (r["day"], r[by]))


def idle_gpu_hours(days: list[dict], by: str) -> list[dict]:
    """The low-utilisation list from ``gpu_hours``' days: per ``by`` over all the days, GPU-hours allocated, used,
    and idle (allocated and not used), the most idle first."""
    totals: dict[str, list[float]] = {}
    for r in days:
        t = totals.setdefault(r[by], [0.0, 0.0])
        t[0] += r["allocated_gpu_hours"]
        t[1] += r["used_gpu_hours"]
    rows = [
        {
            by: key,
            "allocated_gpu_hours": round(allocated, 4),
            "used_gpu_hours": round(used, 4),
            "idle_gpu_hours": round(max(0.0, allocated - used), 4),
            "used_percent": round(100 * used / allocated, 1) if allocated else 0.0,
        }
        for key, (allocated, used) in totals.items()
    ]
    return sorted(rows, key=lambda r: (-r["idle_gpu_hours"], r[by]))
