"""Predictions for the scheduler's snapshot: the decay table (``SharingInfo``) the live loop and the simulator hand
to the sharing policy, so the policy itself never touches the model.

Which mixes are predicted: every pair (a workload twice included) of the workloads of the shareable jobs queued or
running, on each GPU model of the cluster, and, where ``max_jobs_per_gpu`` allows three or more, each mix already
running on a GPU with one more of those workloads. Answers are cached by the predictor, so a cycle only predicts
mixes it has not seen.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from itertools import combinations_with_replacement
from pathlib import Path

from caldera.config import Settings
from caldera.interference.predictor import ModelPredictor, Predictor
from caldera.interference.records import JobType
from caldera.scheduler.sharing import Mix, SharingInfo, can_share
from caldera.scheduler.snapshot import SchedJob, Snapshot

log = logging.getLogger("caldera.sharing")


def prediction_table(
    mixes: Iterable[Sequence[JobType]], predictor: Predictor, gpu: str
) -> dict[tuple[str, Mix], tuple[float, ...]]:
    """``SharingInfo.decay`` entries for ``mixes`` on ``gpu``, in one batched prediction (unknown mixes left out)."""
    ordered = list({tuple(sorted(m, key=lambda t: t.key)): None for m in mixes})
    return {
        (gpu, tuple(t.key for t in mix)): tuple(d)
        for mix, d in zip(ordered, predictor.predict_many(ordered, gpu))
        if d is not None
    }


def pairs(types: Sequence[JobType]) -> list[tuple[JobType, JobType]]:
    return list(combinations_with_replacement(sorted(set(types), key=lambda t: t.key), 2))


def model_path(settings: Settings) -> Path:
    return settings.interference_model or settings.data_dir / "interference.model"


class LivePredictions:
    """The live loop's decay predictions: the model file of ``CALDERA_INTERFERENCE_MODEL`` (re-read when it
    changes, so ``caldera interference train`` takes effect without a restart) and the table for each cycle."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.path = model_path(settings)
        self._predictor: ModelPredictor | None = None
        self._stamp: tuple[int, int] | None = None
        self.problem = ""  # why there are no predictions, for the jobs' why

    def predictor(self) -> ModelPredictor | None:
        try:
            st = os.stat(self.path)
        except OSError:
            self._predictor, self._stamp = None, None
            self.problem = f"no interference model at {self.path} (caldera interference train)"
            return None
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            self._stamp = stamp
            try:
                from caldera.interference.store import load_model

                self._predictor, self.problem = load_model(self.path).predictor(), ""
                log.info("interference model %s loaded", self.path)
            except Exception as exc:  # noqa: BLE001 - a bad file (or no scikit-learn) must not stop scheduling
                self._predictor = None
                self.problem = f"the interference model {self.path} cannot be used: {exc}"
                log.error("%s", self.problem)
        return self._predictor

    def info(
        self,
        snap: Snapshot,
        workloads: Mapping[str, str | None],
        queued_sharers: Sequence[SchedJob] | None = None,
    ) -> SharingInfo | None:
        """The snapshot's ``sharing`` for the jobs' declared ``workloads`` (job id -> spec ``workload``); None when
        no job can share (nothing to predict). ``queued_sharers``: the queued jobs that can share, in the queue's
        order, where the caller keeps them (the live loop: a pass over a long queue costs more than the rest)."""
        s = self.settings
        if queued_sharers is None:
            queued_sharers = [j for j in snap.queued if can_share(j)]
        sharers = [*queued_sharers, *(j for j in snap.running if can_share(j))]
        if not sharers:
            return None
        base = {
            "default_tolerance": s.sharing_default_tolerance,
            "max_jobs_per_gpu": s.sharing_max_jobs_per_gpu,
            "prefer_gain": s.sharing_prefer_gain,
            "drain_for_blocked": s.sharing_drain_for_blocked,
            "pair_on_free": s.sharing_pair_on_free,
            "match_window": s.sharing_match_window,
        }
        predictor = self.predictor()
        if predictor is None:
            return SharingInfo(unavailable=self.problem, **base)  # type: ignore[arg-type]
        types: dict[str, JobType] = {}
        for j in sharers:
            name = workloads.get(j.id)
            if name:
                t = JobType.parse(name, 1)
                if predictor.knows(t):
                    types[j.id] = t
        mixes: list[Sequence[JobType]] = list(pairs(list(types.values())))
        if s.sharing_max_jobs_per_gpu > 2:
            mixes += _grown_mixes(snap, types)
        models = sorted({d.model for n in snap.nodes for d in n.gpus})
        decay = {k: v for m in models for k, v in prediction_table(mixes, predictor, m).items()}
        return SharingInfo(decay, {i: t.key for i, t in types.items()}, **base)  # type: ignore[arg-type]


def _grown_mixes(snap: Snapshot, types: Mapping[str, JobType]) -> list[tuple[JobType, ...]]:
    """Each mix of two or more running on one GPU, with one more of the known workloads."""
    on_gpu: dict[tuple[str, int], list[JobType]] = {}
    for j in snap.running:
        if j.id in types:
            for a in j.allocations:
                for g in a.gpus:
                    on_gpu.setdefault((a.node, g), []).append(types[j.id])
    extra = set(types.values())
    return [(*mix, t) for mix in on_gpu.values() if len(mix) >= 2 for t in extra]
