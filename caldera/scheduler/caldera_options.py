"""The ``caldera`` policy's settings and the constants its layers share (admission, preemption, reservations,
ordering, the cycle): the one module they all import, so none of them imports the policy."""

from __future__ import annotations

from collections.abc import Sequence

EPS = 1e-9
CLASS_NAMES = {3: "high", 2: "normal", 1: "low", 0: "best-effort"}  # priority class rank -> name


class CalderaOptions:
    """The settings of the ``caldera`` policy (:mod:`caldera_policy`), read by every layer of its cycle.

    Options: ``starvation_threshold_s`` (300; None disables reservations and starvation ordering),
    ``starvation_factor`` (1: a job is starving once it waited the threshold or this many times its expected run
    time, whichever is longer), ``default_runtime_estimate_s`` (3600; for running jobs with neither
    ``max_runtime_s`` nor ``expected_runtime_s``), ``max_reservations`` (0 per cycle: off by default, since
    holding nodes idle for starving jobs cost more than it gave on every trace measured, see README; 4 is the usual
    setting where large gangs must be guaranteed a start), ``priority_preemption`` (True: a higher class preempts
    lower ones of the same queue), ``reclaim`` (True), ``fair_share`` (True; False orders by ``queued_since`` within
    a class), ``max_preemptions_per_cycle`` (32: a safety valve against preemption storms, e.g. after a burst of
    high-priority submissions; jobs that would need more wait for the next cycle, when the victims of this one are
    already counted as soon-free), ``las_thresholds_gpu_s`` (1 and 10 GPU-hours: the attained-service levels of
    least-attained-service among batch jobs; None turns it off), ``las_min_run_s`` (0: a batch job is not
    preempted for less attained service before it has run this long since its last start; protecting young jobs
    this way cost average JCT on every trace measured, even with 5 minutes lost per preemption),
    ``las_across_queues`` (``"guarantee"``: least-attained-service may take from any queue that stays at its
    guarantee; ``"share"``: only from queues above their deserved share, which on Gavel's trace left short jobs of
    a small-share queue waiting behind long ones, 2% worse JCT and Jain 0.34), ``aging_threshold_s`` (300: seconds
    after which a low or best-effort job is treated as normal, :mod:`caldera_aging`; None turns it off; on
    Alibaba's trace 1,800 s took caldera from 12.8 d to 42 h average JCT and bounded the p99 wait, 600 s to
    39.6 h; with ``las_best_effort``, 600 s -> 300 s took 2 x 8 / 3 x 8 from 38.88 h / 32.69 h to 38.92 h /
    32.67 h and Jain's index over the classes from 0.598 / 0.655 to 0.779 / 0.775), ``aging_factor`` (0: or that
    many times its expected run time, when longer; with run times learned
    per user the estimate of a user whose jobs mostly take minutes is dominated by a few long ones, and 2x kept
    minute-long best-effort pods waiting two hours on Alibaba's trace), ``within_level`` (see Order) and
    ``speed_placement`` (False: a job that names no GPU model goes where it fits best whatever its speed there;
    True: to the fastest model free, by ``SchedJob.speeds``; on Gavel's trace on 10 x 8 V100 + 10 x 8 P100 + 12 x 8
    K80 that took average JCT from 237.0 h to 241.1 h, as the early jobs took the fast GPUs whatever their gain,
    while p99 wait fell from 1.5 h to 0.3 h; keeping the fast GPUs for jobs that gain most, Gavel's idea, as a
    greedy rule left them idle: 265 h), ``las_victims_by`` (``"youngest"``, see admission, step 4; on sim_quality's
    eight cases it met issue 30's criteria on both Philly sizes and cut the misses from 15 to 9, docs/
    scheduler-efficiency.md; ``"attained"``, the default before, took Gavel's trace on 48 x 8 from the same schedule
    as Tiresias to 113.035 h against its 113.037 h, but put the longest jobs off to the end: Alibaba 2 x 8's
    makespan 8.6% past Tiresias'),
    ``las_starvation_factor`` (3: a preempted batch job that has waited this many times the wall time it ran, at
    least ``starvation_threshold_s``, goes back to the lowest level and, started so, is no LAS victim for a third
    of the time it waited past that, :func:`caldera_aging.promote_starved_batch`; None turns it off; on the whole
    Philly trace it took the 32-GPU gangs of one account from a mean slowdown of 44 to a few, Jain's index over
    accounts from 0.525 to 0.901 and average JCT from 4.45 h to 4.34 h; 1 gave Jain 0.944 at 4.40 h, and 5% more
    JCT on Philly's first 1,500 jobs on 20 x 8), ``las_best_effort`` (False: True is
    least-attained-service among best-effort jobs, admission step 4; on Alibaba's trace 2 x 8 / 3 x 8 it took
    average JCT from 39.10 h / 32.82 h to 38.88 h / 32.69 h with aging after 600 s and attained victims; with
    youngest victims, off gives 39.74 h / 32.62 h against 39.76 h / 32.77 h, 1,442 / 1,312 preemptions against
    1,563 / 1,323, makespan 202.05 d against 205.70 d on 2 x 8, where caldera now meets all of issue 30's criteria
    against Tiresias; p99 JCT 61.66 d against 53.79 d there (Tiresias 70.24 d); Philly and Gavel have no best-effort
    jobs: docs/scheduler-efficiency.md), ``max_preemptions_per_job``
    (100: a job preempted that many times is no least-attained-service victim any more, admission step 4; None: no
    bound. A valve against preemption storms: on Alibaba's trace one pod was preempted 350 times in 1,500 jobs on
    2 x 8; with 100, average JCT 38.92 h -> 38.93 h on 2 x 8, 32.67 h -> 32.96 h on 3 x 8 (Tiresias 41.13 h /
    33.52 h), preemptions 1,619 -> 1,561 and 1,566 -> 1,418, p99 JCT 47.9 d -> 55.8 d on 2 x 8; tighter bounds cost
    the lead: 20 took 3 x 8 to 36.66 h and Jain's index to 0.297, 5 took Philly's 20 x 8 from 28.34 h to 31.17 h
    with more preemptions (313 against 241), other jobs being preempted in their place. Philly's and Gavel's
    cases, at most 12 preemptions of one job, are unchanged). ``las_starvation_max_wait_s`` (None: the longest a
    preempted batch job waits before ``las_starvation_factor``'s promotion, whatever it ran; a job started after
    waiting that long stays protected to its end; see docs/scheduler-efficiency.md). ``best_effort_grace_s`` (0:
    a job not best-effort takes back GPUs lent to best-effort batch jobs (``BestEffort`` preemptions) only once it
    has waited this long since it was queued, hoping short best-effort pods end by themselves; until then its
    ``GangNoFit`` reason says when) and ``best_effort_grace_scope`` (``"lent"``: meanwhile it may still preempt
    least-attained-service victims, and mostly does: on Alibaba's trace 900 s took 3 x 8's ``BestEffort``
    preemptions from 188 to 161 and the least-attained-service ones from 1,124 to 1,195; ``"all"``: no
    least-attained-service preemption for it either while best-effort jobs hold GPUs; 900 s took 3 x 8 from
    1,312 preemptions to 1,035, under Tiresias' 1,089, but every value from 450 to 3,600 s cost 2 x 8 its
    allocation, so it stays off: docs/scheduler-efficiency.md, fifth round of the criteria).
    ``las_promoted_best_effort`` (True: a best-effort job that aging promoted preempts least-attained-service
    victims as a normal job does; False: it takes free GPUs and best-effort jobs only. On Alibaba's trace False met
    every criterion against Tiresias on 2 x 8 and 3 x 8 (870 preemptions on 3 x 8 against Tiresias' 1,089) but took
    Jain's index over the classes from 0.78 / 0.82 to 0.46 / 0.49 and the p99 wait from 6 to 72-76 minutes; not
    adopted yet, same page).
    """

    def __init__(
        self,
        *,
        starvation_threshold_s: float | None = 300.0,
        default_runtime_estimate_s: float = 3600.0,
        max_reservations: int = 0,
        priority_preemption: bool = True,
        reclaim: bool = True,
        fair_share: bool = True,
        max_preemptions_per_cycle: int | None = 32,
        starvation_factor: float = 1.0,
        las_thresholds_gpu_s: Sequence[float] | None = (3600.0, 36000.0),
        las_min_run_s: float = 0.0,
        las_across_queues: str = "guarantee",
        aging_threshold_s: float | None = 300.0,
        aging_factor: float = 0.0,
        within_level: str = "attained",
        speed_placement: bool = False,
        las_victims_by: str = "youngest",
        las_starvation_factor: float | None = 3.0,
        las_best_effort: bool = False,
        max_preemptions_per_job: int | None = 100,
        las_starvation_max_wait_s: float | None = None,
        best_effort_grace_s: float = 0.0,
        best_effort_grace_scope: str = "lent",
        las_promoted_best_effort: bool = True,
    ) -> None:
        self.starvation_threshold_s = starvation_threshold_s
        self.default_runtime_estimate_s = float(default_runtime_estimate_s)
        self.max_reservations = int(max_reservations)
        self.priority_preemption = bool(priority_preemption)
        self.reclaim = bool(reclaim)
        self.fair_share = bool(fair_share)
        self.max_preemptions_per_cycle = max_preemptions_per_cycle
        self.starvation_factor = float(starvation_factor)
        self.las_thresholds_gpu_s = (
            None if las_thresholds_gpu_s is None else tuple(sorted(float(t) for t in las_thresholds_gpu_s))
        )
        self.las_min_run_s = float(las_min_run_s)
        if las_across_queues not in ("share", "guarantee"):
            raise ValueError("las_across_queues must be 'share' or 'guarantee'")
        self.las_across_queues = las_across_queues
        self.aging_threshold_s = aging_threshold_s
        self.aging_factor = float(aging_factor)
        if within_level not in ("fair_share", "attained"):
            raise ValueError("within_level must be 'fair_share' or 'attained'")
        self.within_level = within_level
        self.speed_placement = bool(speed_placement)
        if las_victims_by not in ("attained", "youngest"):
            raise ValueError("las_victims_by must be 'attained' or 'youngest'")
        self.las_victims_by = las_victims_by
        if las_starvation_factor is not None and not float(las_starvation_factor) > 0:
            raise ValueError("las_starvation_factor must be above 0 (None turns it off)")
        self.las_starvation_factor = None if las_starvation_factor is None else float(las_starvation_factor)
        self.las_best_effort = bool(las_best_effort)
        if max_preemptions_per_job is not None and int(max_preemptions_per_job) < 0:
            raise ValueError("max_preemptions_per_job must be 0 or more (None: no bound)")
        self.max_preemptions_per_job = None if max_preemptions_per_job is None else int(max_preemptions_per_job)
        if las_starvation_max_wait_s is not None and not float(las_starvation_max_wait_s) > 0:
            raise ValueError("las_starvation_max_wait_s must be above 0 (None: no cap)")
        self.las_starvation_max_wait_s = None if las_starvation_max_wait_s is None else float(las_starvation_max_wait_s)
        if not float(best_effort_grace_s) >= 0:
            raise ValueError("best_effort_grace_s must be 0 or more")
        self.best_effort_grace_s = float(best_effort_grace_s)
        if best_effort_grace_scope not in ("lent", "all"):
            raise ValueError("best_effort_grace_scope must be 'lent' or 'all'")
        self.best_effort_grace_scope = best_effort_grace_scope
        self.las_promoted_best_effort = bool(las_promoted_best_effort)
