"""GPU-sharing simulation on Gavel's traces: exclusive FIFO vs naive packing vs interference-aware sharing.

Jobs run at the speed of the ground truth (Gavel's measured pairwise throughputs): a job's progress rate is
``1 - decay`` of the mix on its GPU, re-evaluated whenever a mix changes. The scheduler sees only predictions of
a decay model trained on a disjoint part of the data (:func:`held_out_pairs`: the V100 measurements of half the
job-type pairs are never shown to it; benchmarks/interference_sharing.py). One-GPU jobs are shareable (two per
GPU by default); multi-GPU jobs run exclusively unless ``share_gangs`` (an assumption, see :func:`compare`).

Gavel gives no memory sizes, only which pairs did not fit (throughput 0.0). Each job type gets a GPU-memory request
fitted so that "requests fit the device" reproduces those pairs as closely as a per-type number can; a mix that
the requests admit but Gavel says did not fit is an OOM: the newcomer fails, counted, and is queued again as an
exclusive job.

Reported per policy: effective GPU utilisation (sum of normalised throughputs per busy GPU, time-averaged; exclusive
is 1.0), the cluster's normalised throughput (the same sum over all GPUs), average JCT, makespan, p95 decay (over
jobs, each job's time-averaged decay), bad co-locations (mixes formed with a true decay above 0.5 for any member),
OOMs.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from itertools import combinations_with_replacement
from pathlib import Path

import numpy as np

from caldera.core.cluster import Device, Node
from caldera.core.resources import Resources
from caldera.core.tenancy import PriorityClass
from caldera.interference.predictor import Predictor, TablePredictor
from caldera.interference.records import Dataset, JobType, Sample
from caldera.interference.snapshot import pairs, prediction_table
from caldera.scheduler.fifo import FifoPolicy
from caldera.scheduler.sharing import Mix, SharingInfo, SharingPolicy
from caldera.scheduler.snapshot import Policy, SchedJob, Snapshot
from caldera.scheduler.validation import valid_decisions

BAD_DECAY = 0.5
GPU_MEM_MIB = 16 * 1024  # a V100-16GB
POLICIES = ("exclusive", "naive", "aware")


@dataclass(slots=True)
class ShareJob:
    id: str
    job: JobType
    arrival: float
    work_s: float  # solo run time
    gpus: int
    remaining: float = 0.0
    start: float | None = None
    end: float | None = None
    rate: float = 1.0
    decay_time: float = 0.0  # integral of decay over run time
    run_time: float = 0.0
    shareable: bool = True


def load_gavel_jobs(trace_dir: str | Path, ds: Dataset, gpu: str = "v100", limit: int | None = None) -> list[ShareJob]:
    """The Gavel per-VC traces with each job's type; jobs without a solo throughput on ``gpu`` are left out."""
    jobs: list[ShareJob] = []
    for f in sorted(Path(trace_dir).glob("*.trace")):
        with f.open(newline="") as fh:
            for n, row in enumerate(csv.reader(fh, delimiter="\t")):
                if len(row) < 7:
                    continue
                jt = JobType.parse(row[0], int(float(row[6])))
                prof = ds.profiles.get(jt)
                if prof is None or not prof.solo.get(gpu):
                    continue
                work = float(row[4]) / prof.solo[gpu]
                jobs.append(ShareJob(f"{f.stem}-{n}", jt, float(row[5]), work, jt.scale_factor, remaining=work))
    jobs.sort(key=lambda j: (j.arrival, j.id))
    return jobs[:limit] if limit else jobs


def held_out_pairs(
    ds: Dataset, gpu: str, seed: int | list[int] = 0, samples: Sequence[Sample] | None = None
) -> set[tuple[str, frozenset[JobType]]]:
    """Half the unordered job-type pairs measured on ``gpu`` (among ``samples``, all of ``ds`` by default), at
    random: their ``gpu`` samples are test data."""
    rows = ds.samples if samples is None else samples
    pairs = sorted({frozenset((s.target, *s.corunners)) for s in rows if s.gpu == gpu}, key=_pair_key)
    rng = np.random.default_rng(seed)
    return {(gpu, p) for p, keep in zip(pairs, rng.random(len(pairs)) < 0.5) if keep}


def _pair_key(p: frozenset[JobType]) -> tuple[str, ...]:
    return tuple(sorted(t.key for t in p))


def is_held_out(s: Sample, held_out: set[tuple[str, frozenset[JobType]]]) -> bool:
    return (s.gpu, frozenset((s.target, *s.corunners))) in held_out


def fit_memory(ds: Dataset, gpu: str, types: list[JobType], capacity: int = GPU_MEM_MIB) -> dict[JobType, int]:
    """Per-type GPU-memory requests such that a pair's requests fit ``capacity`` iff Gavel measured it running
    (perceptron-style updates on the violated pairs; the residual disagreement shows up as OOMs)."""
    m = {t: 0.4 for t in types}
    pairs = [(a, b, (gpu, frozenset((a, b))) not in ds.infeasible) for i, a in enumerate(types) for b in types[i:]]
    pairs = [(a, b, ok) for a, b, ok in pairs if ds.ratio(gpu, a, b) is not None]
    for _ in range(300):
        wrong = 0
        for a, b, ok in pairs:
            s = m[a] + m[b]
            if ok and s > 1.0:
                m[a] -= 0.01
                m[b] -= 0.01
                wrong += 1
            elif not ok and s <= 1.02:  # a margin, so rounding to MiB keeps the pair apart
                m[a] += 0.01
                m[b] += 0.01
                wrong += 1
        if not wrong:
            break
    return {t: max(1, int(min(1.0, max(0.01, x)) * capacity)) for t, x in m.items()}


@dataclass(slots=True)
class Outcome:
    policy: str
    jobs: int
    avg_jct_s: float
    makespan_s: float
    eff_util_busy: float
    cluster_throughput: float
    p95_decay: float
    bad_colocations: int
    colocations: int
    ooms: int
    # the share of busy GPU time that multi-GPU jobs held, and the effective utilisation of the rest (the GPUs of
    # one-GPU jobs)
    gang_share: float = 0.0
    eff_util_one_gpu: float = 0.0
    eff_util_gangs: float = 0.0  # the same on the GPUs multi-GPU jobs held
    gang_colocations: int = 0  # co-locations formed by a multi-GPU job joining another
    # starts the decision checks refused (scheduler/validation.py, as in the live loop and the trace simulator)
    invalid_starts: int = 0
    extra: dict[str, float] = field(default_factory=dict)


class ShareSim:
    """One replay. ``truth[(target, corunner)]`` is the co-located speed ratio on the simulated GPU (0.0: OOM)."""

    def __init__(
        self,
        jobs: list[ShareJob],
        truth: Callable[[JobType, JobType], float | None],
        memory: dict[JobType, int],
        info: SharingInfo | None,
        policy: Policy,
        *,
        nodes: int,
        gpus_per_node: int,
        gpu_model: str = "v100",
        share_gangs: bool = False,
    ) -> None:
        self.jobs = [
            replace(j, remaining=j.work_s, shareable=j.shareable and (share_gangs or j.gpus == 1)) for j in jobs
        ]
        self.truth = truth
        self.memory = memory
        self.policy = policy
        self.info = info
        self.model = gpu_model
        self.nodes = [
            Node(f"n{i}", 64.0, 512 * 1024, tuple(Device(g, gpu_model, GPU_MEM_MIB) for g in range(gpus_per_node)))
            for i in range(nodes)
        ]
        self.total_gpus = nodes * gpus_per_node
        self.sched: dict[str, SchedJob] = {}
        self.on_gpu: dict[tuple[str, int], list[str]] = {}
        self.bad = self.colocs = self.ooms = 0
        self.busy_area = self.tput_area = 0.0
        self.gang_area = 0.0  # GPU-seconds of GPUs held by multi-GPU jobs
        self.gang_tput_area = 0.0  # their normalised throughput, integrated
        self.gang_colocs = 0
        self.invalid = 0

    def _sched_job(self, j: ShareJob) -> SchedJob:
        share = j.shareable
        req = Resources(cpu=1.0, memory_mib=1024, gpu=j.gpus, gpu_memory_mib=self.memory.get(j.job) if share else None)
        return SchedJob(
            j.id, j.id, "gavel", "gavel", PriorityClass.NORMAL, req, 1, j.arrival, j.arrival, shareable=share
        )

    def _decay(self, target: ShareJob, others: list[ShareJob]) -> float:
        total = 0.0
        for o in others:
            r = self.truth(target.job, o.job)
            total += 1.0 if r is None else 1.0 - r  # an unmeasured mix: assume no progress (never happens in Gavel)
        return min(1.0, max(0.0, total))

    def _rates(self, by_id: dict[str, ShareJob]) -> None:
        """Each running job's speed next to its partners (a gang's ranks all share the same partners)."""
        for ids in self.on_gpu.values():
            for i in ids:
                by_id[i].rate = 1.0 - self._decay(by_id[i], [by_id[k] for k in ids if k != i])

    def run(self) -> list[ShareJob]:
        by_id = {j.id: j for j in self.jobs}
        arrivals = list(self.jobs)
        ai = 0
        queued: dict[str, SchedJob] = {}
        running: dict[str, SchedJob] = {}
        now = 0.0
        while ai < len(arrivals) or running or queued:
            t_next = arrivals[ai].arrival if ai < len(arrivals) else math.inf
            t_done = min(
                (now + by_id[i].remaining / by_id[i].rate for i in running if by_id[i].rate > 0), default=math.inf
            )
            t = min(t_next, t_done)
            if t == math.inf:
                break  # nothing can progress (queued jobs that never fit)
            self._advance(running, by_id, t - now)
            now = t
            for i in [i for i in running if by_id[i].remaining <= 1e-6 * max(1.0, by_id[i].work_s)]:
                self._finish(by_id[i], running.pop(i), now)
            while ai < len(arrivals) and arrivals[ai].arrival <= now:
                j = arrivals[ai]
                queued[j.id] = self.sched[j.id] = self._sched_job(j)
                ai += 1
            for _ in range(8):  # a start may let the policy start more (FIFO's head): call again at the same time
                if not self._cycle(now, queued, running, by_id):
                    break
            self._rates(by_id)
        return self.jobs

    def _advance(self, running: dict[str, SchedJob], by_id: dict[str, ShareJob], dt: float) -> None:
        if dt <= 0:
            return
        for i in running:
            j = by_id[i]
            j.remaining -= dt * j.rate
            j.run_time += dt
            j.decay_time += dt * (1.0 - j.rate)
        self.busy_area += dt * len(self.on_gpu)
        self.tput_area += dt * sum(by_id[i].rate for ids in self.on_gpu.values() for i in ids)
        gang_gpus = [ids for ids in self.on_gpu.values() if by_id[ids[0]].gpus > 1]
        self.gang_area += dt * len(gang_gpus)
        self.gang_tput_area += dt * sum(by_id[i].rate for ids in gang_gpus for i in ids)

    def _finish(self, j: ShareJob, sj: SchedJob, now: float) -> None:
        j.end = now
        for a in sj.allocations:
            for g in a.gpus:
                ids = self.on_gpu[(a.node, g)]
                ids.remove(j.id)
                if not ids:
                    del self.on_gpu[(a.node, g)]

    def _cycle(self, now: float, queued: dict, running: dict, by_id: dict[str, ShareJob]) -> bool:
        if not queued:
            return False
        snap = Snapshot(now, self.nodes, list(queued.values()), list(running.values()), explain=False)
        snap.sharing = self.info
        d, problems = valid_decisions(snap, self.policy(snap))
        self.invalid += len(problems)
        for s in d.starts:
            sj = queued.pop(s.job_id)
            j = by_id[s.job_id]
            places = [(a.node, g) for a in s.allocations for g in a.gpus]
            others = [by_id[k] for k in dict.fromkeys(k for p in places for k in self.on_gpu.get(p, []))]
            if others:
                self.colocs += 1
                self.gang_colocs += j.gpus > 1
                if any(self.truth(j.job, o.job) == 0.0 for o in others):
                    self.ooms += 1  # did not fit after all: it fails and waits again, alone this time
                    j.shareable = False
                    queued[j.id] = self.sched[j.id] = self._sched_job(j)
                    continue
                mix = [j, *others]
                if any(self._decay(x, [y for y in mix if y is not x]) > BAD_DECAY for x in mix):
                    self.bad += 1
            sj.allocations, sj.started_at = s.allocations, now
            running[sj.id] = sj
            if j.start is None:
                j.start = now
            for p in places:
                self.on_gpu.setdefault(p, []).append(j.id)
        return bool(d.starts)

    def outcome(self, name: str) -> Outcome:
        done = [j for j in self.jobs if j.end is not None]
        jct = np.array([j.end - j.arrival for j in done])  # type: ignore[operator]
        decay = np.array([j.decay_time / j.run_time for j in done if j.run_time > 0])
        start = min(j.arrival for j in self.jobs)
        end = max((j.end for j in done), default=start)
        return Outcome(
            name,
            len(done),
            float(jct.mean()) if len(jct) else math.nan,
            float(end - start),
            self.tput_area / self.busy_area if self.busy_area else 0.0,
            self.tput_area / (self.total_gpus * (end - start)) if end > start else 0.0,
            float(np.percentile(decay, 95)) if len(decay) else 0.0,
            self.bad,
            self.colocs,
            self.ooms,
            self.gang_area / self.busy_area if self.busy_area else 0.0,
            (self.tput_area - self.gang_tput_area) / (self.busy_area - self.gang_area)
            if self.busy_area > self.gang_area
            else 0.0,
            self.gang_tput_area / self.gang_area if self.gang_area else 0.0,
            self.gang_colocs,
            self.invalid,
        )


def same_size_pairs(types: list[JobType]) -> list[tuple[JobType, JobType]]:
    """The pairs the sharing policy can form: two jobs of one GPU count (a gang shares only with its own shape)."""
    return [(a, b) for a, b in pairs(types) if a.scale_factor == b.scale_factor]


def as_one_gpu(t: JobType) -> JobType:
    return replace(t, scale_factor=1)


def _gang_entries(table: dict[tuple[str, Mix], tuple[float, ...]], types: list[JobType], gpu: str) -> None:
    """Gang pairs in a decay table, copied from the pairs of their one-GPU versions (the same sorted order: the
    keys differ only in the scale factor at their end)."""
    for a, b in same_size_pairs(types):
        if a.scale_factor > 1:
            one = table.get((gpu, (as_one_gpu(a).key, as_one_gpu(b).key)))
            if one is not None:
                table[(gpu, (a.key, b.key))] = one


def compare(
    ds: Dataset,
    jobs: list[ShareJob],
    predictor: Predictor,
    *,
    nodes: int,
    gpus_per_node: int,
    gpu: str = "v100",
    tolerance: float = 0.35,
    prefer_gain: float | None = None,
    max_jobs_per_gpu: int = 2,
    oracle: bool = False,
    match_window: int = 1,
    min_gain: float = 0.0,
    keep_order: bool = False,
    drain_for_blocked: bool = False,
    pair_on_free: bool = False,
    share_gangs: bool = False,
    only: Collection[str] | None = None,
    sim_class: Callable[..., ShareSim] = ShareSim,
) -> list[Outcome]:
    """Run the three policies on ``jobs``; ``predictor`` is what the interference-aware scheduler is told.

    ``only``: just the runs of these names; ``sim_class``: a ShareSim that also measures something of its own
    (benchmarks/sharing_breakdown.py).

    ``share_gangs``: multi-GPU jobs are shareable too, with jobs of their own GPU count on the same GPUs. Gavel
    measured no such pair (it lists them all as 0.0, never space-shared), so this is an assumption, not ground
    truth: each rank runs as the one-GPU versions of the two job types did side by side (decay, memory and the
    predictions alike), leaving out any contention of the gangs' gradient exchanges."""
    types = sorted({j.job for j in jobs if share_gangs or j.gpus == 1}, key=lambda t: t.key)
    one_gpu = sorted({as_one_gpu(t) for t in types}, key=lambda t: t.key)
    fitted = fit_memory(ds, gpu, one_gpu)
    memory = {t: fitted[as_one_gpu(t)] for t in types}
    mixes: list[tuple[JobType, ...]] = list(same_size_pairs(one_gpu))
    if max_jobs_per_gpu > 2:  # one-GPU triples; the truth charges each job the sum of its pairwise decays
        mixes += list(combinations_with_replacement([t for t in one_gpu if t in types], 3))

    def truth(a: JobType, b: JobType) -> float | None:
        return ds.ratio(gpu, as_one_gpu(a), as_one_gpu(b)) if share_gangs else ds.ratio(gpu, a, b)

    def table(p: Predictor) -> dict[tuple[str, Mix], tuple[float, ...]]:
        t = prediction_table(mixes, p, gpu)
        _gang_entries(t, types, gpu)
        return t

    workload = {j.id: j.job.key for j in jobs if j.job in memory}
    aware_info = SharingInfo(
        table(predictor),
        workload,
        default_tolerance=tolerance,
        prefer_gain=prefer_gain,
        max_jobs_per_gpu=max_jobs_per_gpu,
        match_window=match_window,
        min_gain=min_gain,
        keep_order=keep_order,
        drain_for_blocked=drain_for_blocked,
        pair_on_free=pair_on_free,
    )
    naive_info = SharingInfo({}, workload)
    runs: list[tuple[str, SharingInfo | None, Policy]] = [
        ("exclusive FIFO", None, FifoPolicy()),
        ("naive packing", naive_info, SharingPolicy(FifoPolicy(), aware=False)),
        ("interference-aware", aware_info, SharingPolicy(FifoPolicy(), aware=True)),
    ]
    if oracle:  # the same policy told the measured decays: what perfect predictions would buy
        measured = TablePredictor({(gpu, a, b): 1.0 - r for (g, a, b), r in ds.ratios.items() if g == gpu and r > 0})
        runs.append(("aware, measured decays", replace(aware_info, decay=table(measured)), SharingPolicy(FifoPolicy())))
    out = []
    for name, info, pol in runs:
        if only is not None and name not in only:
            continue
        sim = sim_class(
            jobs,
            truth,
            memory,
            info,
            pol,
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            gpu_model=gpu,
            share_gangs=share_gangs,
        )
        sim.run()
        out.append(sim.outcome(name))
    return out
