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

    def predict_many(self, mixes: Sequence[Sequence[JobType]], gpu: str) -> list[list[float] | None]:
        """:meth:`predict` of each mix (one batched call where the model allows)."""
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
        return self.predict_many([mix], gpu)[0]

    def predict_many(self, mixes: Sequence[Sequence[JobType]], gpu: str) -> list[list[float] | None]:
        todo = [tuple(m) for m in mixes if (gpu, tuple(m)) not in self._cache]
        samples: list[Sample] = []
        for mix in todo:
            if len(mix) < 2:
                self._cache[(gpu, mix)] = [0.0] * len(mix)
            elif not all(self.knows(j) and gpu in self.profiles[j].solo for j in mix):
                self._cache[(gpu, mix)] = None
            else:
                samples += [Sample(gpu, j, mix[:i] + mix[i + 1 :], 0.0) for i, j in enumerate(mix)]
        decays = iter(self.model.predict_samples(samples, self.profiles).tolist())
        for mix in todo:
            if (gpu, mix) not in self._cache:
                self._cache[(gpu, mix)] = [next(decays) for _ in mix]
        return [self._cache[(gpu, tuple(m))] for m in mixes]


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

    def predict_many(self, mixes: Sequence[Sequence[JobType]], gpu: str) -> list[list[float] | None]:
        return [self.predict(m, gpu) for m in mixes]
