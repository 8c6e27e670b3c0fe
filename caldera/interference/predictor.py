"""The predictor interface: the predicted decay of every job in a candidate mix on one GPU type.

Decay is ``1 - co_speed / solo_speed``: 0 runs as fast as alone, 0.5 at half speed. A predictor returns ``None``
for a job it knows nothing about (no solo profile): callers treat that conservatively (do not share).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from caldera.interference.model import DecayModel
from caldera.interference.records import JobType, Profile, Sample


class Predictor(Protocol):
    def predict(self, mix: Sequence[JobType], gpu: str) -> list[float] | None:
        """The decay of each job of ``mix`` (in order) when all run together on a GPU of type ``gpu``; None when a
        job of the mix has no profile."""
        ...


class ModelPredictor:
    """A trained :class:`DecayModel` and the solo profiles it may be asked about. Answers are cached per mix."""

    def __init__(self, model: DecayModel, profiles: dict[JobType, Profile]) -> None:
        self.model = model
        self.profiles = profiles
        self._cache: dict[tuple[str, tuple[JobType, ...]], list[float] | None] = {}

    def knows(self, job: JobType) -> bool:
        return job in self.profiles

    def predict(self, mix: Sequence[JobType], gpu: str) -> list[float] | None:
        key = (gpu, tuple(mix))
        if key not in self._cache:
            self._cache[key] = self._predict(mix, gpu)
        return self._cache[key]

    def _predict(self, mix: Sequence[JobType], gpu: str) -> list[float] | None:
        if len(mix) < 2:
            return [0.0] * len(mix)
        if not all(self.knows(j) for j in mix) or not all(gpu in self.profiles[j].solo for j in mix):
            return None
        samples = [Sample(gpu, j, tuple(mix[:i]) + tuple(mix[i + 1 :]), 0.0) for i, j in enumerate(mix)]
        return [float(x) for x in self.model.predict_samples(samples, self.profiles)]


class TablePredictor:
    """Decays looked up in measured data (the simulator's ground truth): ``table[(gpu, target, corunner)]`` is the
    target's decay next to that one co-runner. Mixes of three or more add the pairwise decays (capped at 1), a
    deliberately pessimistic reading since Gavel measured pairs only."""

    def __init__(self, table: dict[tuple[str, JobType, JobType], float]) -> None:
        self.table = table

    def predict(self, mix: Sequence[JobType], gpu: str) -> list[float] | None:
        out = []
        for i, j in enumerate(mix):
            total = 0.0
            for k, other in enumerate(mix):
                if k != i:
                    d = self.table.get((gpu, j, other))
                    if d is None:
                        return None
                    total += d
            out.append(min(1.0, total))
        return out
