"""The versioned model file: a pickle of the model, the solo profiles it was trained with, its feature list and
training metadata. Loading checks the file's format version and that the feature list matches the code's, so a
model trained by another version of the feature extraction is refused instead of silently mis-read.

Unpickling runs code from the file: load only model files you wrote (the platform's data directory is 0711, the
file 0600). Loading needs the estimator's library (scikit-learn, the extra ``interference``).
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from caldera.interference.model import DecayModel
from caldera.interference.predictor import ModelPredictor
from caldera.interference.records import JobType, Profile

FORMAT = "caldera-interference-model"
FORMAT_VERSION = 1


class ModelFileError(ValueError):
    pass


@dataclass(slots=True)
class ModelFile:
    model: DecayModel
    profiles: dict[JobType, Profile]
    metadata: dict[str, Any] = field(default_factory=dict)  # trained_at, source, samples, estimator, scores...

    def predictor(self) -> ModelPredictor:
        return ModelPredictor(self.model, self.profiles)


def save_model(path: str | Path, mf: ModelFile) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "features": mf.model.features,
        "metadata": mf.metadata,
        "model": mf.model,
        "profiles": mf.profiles,
    }
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        pickle.dump(payload, f, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, path)
    return path


def load_model(path: str | Path) -> ModelFile:
    with Path(path).open("rb") as f:
        payload = pickle.load(f)
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ModelFileError(f"{path} is not a Caldera interference model")
    if payload.get("version") != FORMAT_VERSION:
        raise ModelFileError(f"{path} has model format {payload.get('version')}; this Caldera reads {FORMAT_VERSION}")
    model = payload["model"]
    if payload["features"] != model.features:
        raise ModelFileError(f"{path} was trained on other features than this Caldera extracts; retrain it")
    return ModelFile(model, payload["profiles"], payload["metadata"])
