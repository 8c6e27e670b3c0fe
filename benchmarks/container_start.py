"""Container start overhead against the process runtime: median of N starts of a job running ``true``.

    python benchmarks/container_start.py [--starts 20] [--image caldera/base:bookworm]

For each runtime, every start is timed twice: ``launch()`` returning (every rank exists and its command started)
and the command having run (the start of the ``observe()`` call that first reports the job ended; polled every
10 ms). Jobs run as root's own user with no owner (the owner's uid costs both runtimes the same), one at a time,
in a throw-away data directory. Needs root and, for the container runtime, podman and the base image
(``caldera images bootstrap``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from caldera.config import Settings  # noqa: E402
from caldera.core.spec import JobSpec  # noqa: E402
from caldera.runtime.base import Handle, LaunchRequest, Phase, Runtime  # noqa: E402
from caldera.runtime.container.runtime import ContainerRuntime  # noqa: E402
from caldera.runtime.container.settings import ContainerSettings  # noqa: E402
from caldera.runtime.local.runtime import LocalRuntime  # noqa: E402

_ENDED = (Phase.SUCCEEDED, Phase.FAILED, Phase.LOST)


def one_start(rt: Runtime, job_id: str, workdir: Path) -> tuple[float, float]:
    spec = JobSpec(name="bench", command=["true"])
    t0 = time.perf_counter()
    h: Handle = rt.launch(LaunchRequest(job_id, 1, spec, (), workdir))
    launched = time.perf_counter() - t0
    while True:
        polled = time.perf_counter()
        obs = rt.observe(h)
        if obs.phase in _ENDED:
            if obs.phase is not Phase.SUCCEEDED:
                raise SystemExit(f"{rt.name}: job {job_id} ended {obs.phase.value}: {obs.message}")
            return launched, polled - t0
        time.sleep(0.01)


def bench(rt: Runtime, starts: int, tmp: Path) -> tuple[list[float], list[float]]:
    one_start(rt, f"warm-{rt.name}", tmp / "work")  # first start pays for caches (page cache, image layers)
    launches, runs = [], []
    for i in range(starts):
        a, b = one_start(rt, f"{rt.name}-{i}", tmp / "work")
        launches.append(a)
        runs.append(b)
    return launches, runs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--starts", type=int, default=20)
    ap.add_argument("--image", default=ContainerSettings().image)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="caldera-bench-") as d:
        tmp = Path(d)
        settings = Settings(data_dir=tmp / "data", runtime="local")
        runtimes: list[Runtime] = [
            LocalRuntime(settings),
            ContainerRuntime(settings, ContainerSettings(image=args.image)),
        ]
        results = {rt.name: bench(rt, args.starts, tmp) for rt in runtimes}
    print(f"median of {args.starts} starts of `true`, ms")
    print(f"{'runtime':<10} {'launch() returns':>17} {'command has run':>16}")
    med = {name: (statistics.median(a) * 1000, statistics.median(b) * 1000) for name, (a, b) in results.items()}
    for name, (a, b) in med.items():
        print(f"{name:<10} {a:>17.0f} {b:>16.0f}")
    over = (med["container"][0] - med["local"][0], med["container"][1] - med["local"][1])
    print(f"{'overhead':<10} {over[0]:>17.0f} {over[1]:>16.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
