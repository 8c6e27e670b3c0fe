from __future__ import annotations

from pathlib import Path

import pytest

from caldera.config import Settings


@pytest.fixture(scope="session")
def traces_dir() -> Path:
    d = Path(Settings().traces_dir)
    if not (d / "philly_jobs.csv").exists():
        pytest.skip(f"trace data not found under {d} (set CALDERA_TRACES_DIR)")
    return d
