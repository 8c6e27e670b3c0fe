from __future__ import annotations

from pathlib import Path

import pytest

from caldera.config import Settings
from caldera.interference.records import Dataset, gavel_path, load_gavel_pairs


@pytest.fixture(scope="session")
def gavel() -> Dataset:
    path = gavel_path(Settings().shared_data_dir)
    if not path.exists():
        pytest.skip(f"Gavel co-location data not found at {path} (set CALDERA_SHARED_DATA_DIR)")
    return load_gavel_pairs(path)


@pytest.fixture(scope="session")
def gavel_file() -> Path:
    path = gavel_path(Settings().shared_data_dir)
    if not path.exists():
        pytest.skip(f"Gavel co-location data not found at {path}")
    return path
