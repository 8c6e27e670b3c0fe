"""Where the interference-aware policy's GPU time goes, for the GPUs one-GPU jobs hold (the ones sharing acts on):
shared; alone while one-GPU jobs waited, by the best any of them could do next to it (predicted past a tolerance,
or the memory requests do not fit); alone with no one-GPU job waiting. Also the free GPUs while one-GPU jobs
waited (the FIFO head, a gang, holding them back) and a shared GPU's mean normalised throughput.

    python benchmarks/sharing_breakdown.py [--seed 0] [--limit 1500] [--skip 0] [--nodes 6] [--tolerance 0.45]

The experiment of benchmarks/interference_sharing.py with its defaults (caldera/sim/sharing_experiment.py), its
``interference-aware`` row only, one split seed.
"""

from __future__ import annotations

import argparse

from caldera.config import Settings
from caldera.sim.sharing_experiment import run_experiment
from caldera.sim.sharing_sim import GPU_MEM_MIB, ShareSim

WAITING_LOOKED_AT = 60  # the first waiting one-GPU jobs judged next to each lone job (the rest rarely differ)
RANK = {"nothing": 0, "memory": 1, "tolerance": 2, "fits": 3}


class BreakdownSim(ShareSim):
    """A replay that classifies each stretch of one-GPU jobs' GPU time (see the module docstring)."""

    def __init__(self, *args, **kw) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kw)
        self.time: dict[str, float] = {}
        self.queued: dict = {}
        self.lone_best: dict[tuple[str, int], str] = {}

    def _cycle(self, now, queued, running, by_id):  # type: ignore[no-untyped-def]
        self.queued = queued
        started = super()._cycle(now, queued, running, by_id)
        waiting = [by_id[i] for i in queued if by_id[i].gpus == 1 and by_id[i].shareable][:WAITING_LOOKED_AT]
        self.lone_best = {}
        for place, ids in self.on_gpu.items():
            if len(ids) == 1 and by_id[ids[0]].gpus == 1:
                best = "nothing"
                for w in waiting:
                    best = max(best, self._judge(by_id[ids[0]], w), key=RANK.__getitem__)
                self.lone_best[place] = best
        return started

    def _judge(self, alone, waiting) -> str:  # type: ignore[no-untyped-def]
        if self.memory[alone.job] + self.memory[waiting.job] > GPU_MEM_MIB:
            return "memory"
        assert self.info is not None
        d = self.info.predicted(self.model, [self.sched[alone.id], self.sched[waiting.id]])
        if d is None:
            return "nothing"
        return "tolerance" if max(d.values()) > self.info.default_tolerance else "fits"

    def _advance(self, running, by_id, dt) -> None:  # type: ignore[no-untyped-def]
        if dt > 0:
            waiting = any(by_id[i].gpus == 1 for i in self.queued)
            for place, ids in self.on_gpu.items():
                if by_id[ids[0]].gpus > 1:
                    continue
                if len(ids) > 1:
                    key = "shared"
                elif waiting:
                    key = f"alone, best waiting partner: {self.lone_best.get(place, 'nothing')}"
                else:
                    key = "alone, none waiting"
                self.time[key] = self.time.get(key, 0.0) + dt
            if waiting:
                free = self.total_gpus - len(self.on_gpu)
                key = "free GPUs while one-GPU jobs waited"
                self.time[key] = self.time.get(key, 0.0) + dt * free
        super()._advance(running, by_id, dt)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--limit", type=int, default=1500)
    ap.add_argument("--skip", type=int, default=0)
    ap.add_argument("--nodes", type=int, default=6)
    ap.add_argument("--tolerance", type=float, default=0.45)
    ap.add_argument("--prefer-gain", type=float, default=0.6)
    args = ap.parse_args()
    data = Settings().shared_data_dir if args.data_dir is None else args.data_dir
    sims: list[BreakdownSim] = []

    def breakdown_sim(*a, **kw) -> BreakdownSim:  # type: ignore[no-untyped-def]
        sims.append(BreakdownSim(*a, **kw))
        return sims[-1]

    ex = run_experiment(
        data,
        nodes=args.nodes,
        limit=args.limit,
        skip=args.skip,
        tolerance=args.tolerance,
        prefer_gain=args.prefer_gain,
        seed=args.seed,
        only={"interference-aware"},
        sim_class=breakdown_sim,
    )
    (out,), (sim,) = ex.outcomes, sims
    one_gpu_time = sum(v for k, v in sim.time.items() if not k.startswith("free"))
    print(ex.summary())
    print(
        f"seed {args.seed}: eff. util {out.eff_util_busy:.3f}, gang share {out.gang_share:.2f}, "
        f"one-GPU jobs' GPUs {out.eff_util_one_gpu:.3f}"
    )
    for k, v in sorted(sim.time.items()):
        print(f"  {k}: {v / one_gpu_time:.3f} of one-GPU jobs' GPU time")
    alone = sum(v for k, v in sim.time.items() if k.startswith("alone"))
    shared_tput = (out.eff_util_one_gpu * one_gpu_time - alone) / sim.time["shared"]
    print(f"  a shared GPU's mean normalised throughput: {shared_tput:.3f}")


if __name__ == "__main__":
    main()
