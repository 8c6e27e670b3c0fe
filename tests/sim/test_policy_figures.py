"""benchmarks/policy_figures.py runs the scripts that print the README's policy figures, with the arguments they
accept."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import policy_figures  # noqa: E402


def test_every_step_is_a_script_that_accepts_its_arguments(tmp_path: Path) -> None:
    full = policy_figures.steps(tmp_path, quick=False)
    quick = policy_figures.steps(tmp_path, quick=True)
    assert [s[0] for s in full] == ["bench_schedule.py", "sim_quality.py", "idle_capacity.py", "bench_sim.py"]
    assert [s[0] for s in quick] == ["bench_schedule.py", "sim_quality.py", "idle_capacity.py"]
    for script, *args in full:
        # --help after the real arguments: argparse rejects an unknown option or a bad value before printing help
        r = subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / script), *args, "--help"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, (script, r.stderr)
        assert "usage:" in r.stdout
