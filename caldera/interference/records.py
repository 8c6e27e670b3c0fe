"""Job types and co-location samples.

A *job type* is what the decay model knows a job by: its model family, batch size and scale factor (GPUs), plus
its solo profile (throughput per GPU type and, from ``caldera profile``, utilisation metrics). A *sample* is one
measured co-location: the target's decay ``1 - co_speed / solo_speed`` next to one or more co-runners on one GPU.

Gavel's file (``colocation/gavel_simulation_throughputs.json``) is read as
``{gpu: {"('<job type>', sf)": {"null": solo, "('<other>', sf)": [self, other]}}}``; ``0.0`` means the pair did
not fit in GPU memory, and such pairs are kept apart as ``infeasible`` instead of being learnt as a decay.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

GAVEL_FILE = Path("colocation") / "gavel_simulation_throughputs.json"
GAVEL_GPUS = ("k80", "p100", "v100")
_BATCH = re.compile(r"^(?P<family>.+?) \(batch size (?P<bs>\d+)\)$")


@dataclass(slots=True, frozen=True)
class JobType:
    family: str  # model family, e.g. "ResNet-50"
    batch_size: int  # 0 when the workload has none (A3C, CycleGAN)
    scale_factor: int = 1  # GPUs

    @classmethod
    def parse(cls, name: str, scale_factor: int = 1) -> JobType:
        """``"ResNet-50 (batch size 64)"`` -> ``JobType("ResNet-50", 64, sf)``; ``"A3C"`` -> batch size 0."""
        m = _BATCH.match(name.strip())
        if m:
            return cls(m["family"], int(m["bs"]), scale_factor)
        return cls(name.strip(), 0, scale_factor)

    @property
    def name(self) -> str:
        return f"{self.family} (batch size {self.batch_size})" if self.batch_size else self.family

    @property
    def key(self) -> str:
        return f"{self.name}|{self.scale_factor}"


@dataclass(slots=True)
class Profile:
    """What is known of a job type running alone: ``solo[gpu]`` (steps/s) and optional utilisation ``metrics``
    (the solo record's columns, e.g. ``gpu_util_avg``)."""

    job: JobType
    solo: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True, frozen=True)
class Sample:
    gpu: str
    target: JobType
    corunners: tuple[JobType, ...]
    decay: float  # 1 - co_speed / solo_speed of the target


@dataclass(slots=True)
class Dataset:
    profiles: dict[JobType, Profile]
    samples: list[Sample]
    infeasible: set[tuple[str, frozenset[JobType]]] = field(default_factory=set)  # (gpu, the mix) that did not fit
    # co-located speed of the target divided by its solo speed, for every measured (gpu, target, co-runner)
    ratios: dict[tuple[str, JobType, JobType], float] = field(default_factory=dict)

    def ratio(self, gpu: str, target: JobType, corunner: JobType) -> float | None:
        """Measured ``co_speed / solo_speed`` of ``target`` next to ``corunner`` (0.0: did not fit; None: not
        measured)."""
        return self.ratios.get((gpu, target, corunner))


def gavel_path(data_dir: str | Path) -> Path:
    return Path(data_dir) / GAVEL_FILE


def load_gavel_pairs(path: str | Path, gpus: tuple[str, ...] = GAVEL_GPUS) -> Dataset:
    """Gavel's solo and pairwise throughputs on ``gpus`` as profiles and samples (one sample per ordered pair)."""
    data = json.loads(Path(path).read_text())
    profiles: dict[JobType, Profile] = {}
    raw: list[tuple[str, JobType, JobType, float]] = []
    for gpu in gpus:
        for key, entry in data[gpu].items():
            job = _job(key)
            solo = float(entry.get("null") or 0.0)
            if solo <= 0:
                continue
            profiles.setdefault(job, Profile(job)).solo[gpu] = solo
            for other_key, speeds in entry.items():
                if other_key != "null":
                    raw.append((gpu, job, _job(other_key), float(speeds[0]) / solo))
    ds = Dataset(profiles, [])
    for gpu, job, other, ratio in raw:
        if other not in profiles:
            continue
        ds.ratios[(gpu, job, other)] = ratio
        if ratio <= 0:
            ds.infeasible.add((gpu, frozenset((job, other))))
        else:
            ds.samples.append(Sample(gpu, job, (other,), max(0.0, 1.0 - ratio)))
    return ds


def _job(key: str) -> JobType:
    name, sf = ast.literal_eval(key)
    return JobType.parse(name, int(sf))


def _profile_job(model: str, batch_size: str, amp: str, gpu_num: str = "1") -> JobType:
    family = f"{model}+amp" if amp not in ("", "0", "False") else model
    return JobType(family, int(float(batch_size or 0)), max(1, int(float(gpu_num or 1))))


def _label_job(label: str) -> JobType:
    """``resnet18@8+amp`` (a ``co_models`` entry of ``caldera profile``) as a job type."""
    name, _, rest = label.partition("@")
    bs, _, amp = rest.partition("+")
    return _profile_job(name, bs, "1" if amp == "amp" else "0")


def load_profile_records(directory: str | Path) -> Dataset:
    """The platform's own records (``solo.csv`` and ``coloc.csv`` written by ``caldera profile``) as a dataset.
    A job type is the workload (``+amp`` when AMP was on), its batch size and GPU count."""
    import csv

    d = Path(directory)
    profiles: dict[JobType, Profile] = {}
    with (d / "solo.csv").open(newline="") as f:
        for row in csv.DictReader(f):
            job = _profile_job(row["model"], row["batchsize"], row["amp"], row["gpu_num"])
            p = profiles.setdefault(job, Profile(job))
            if row["speed"]:  # empty in the records the platform measures from running jobs (no step count)
                p.solo[row["gpu"]] = float(row["speed"])
            p.metrics.update({k: float(v) for k, v in row.items() if v and k.endswith(("_avg", "_max"))})
    ds = Dataset(profiles, [])
    if not (d / "coloc.csv").exists():  # solo records only (the platform's own): profiles, no decay samples
        return ds
    with (d / "coloc.csv").open(newline="") as f:
        for row in csv.DictReader(f):
            target = _profile_job(row["model"], row["batchsize"], row["amp"])
            co = tuple(_label_job(x) for x in row["co_models"].split(";") if x)
            if target in profiles and all(c in profiles for c in co):
                ds.samples.append(Sample(row["gpu"], target, co, float(row["decay"])))
                if len(co) == 1:
                    ds.ratios[(row["gpu"], target, co[0])] = 1.0 - float(row["decay"])
    return ds
