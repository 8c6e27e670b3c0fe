"""The governance decisions as pure functions: idle detection and runtime limits, without time passing."""

from __future__ import annotations

from caldera.core.governance import Governance, IdleRule
from caldera.governance.decide import Action, JobFacts, covered, idle, runtime

RULE = IdleRule(threshold_percent=5, window_s=3600, grace_s=600)
GAP = 60.0
NOW = 100_000.0


def series(start: float, end: float, percent: float, every: float = 10.0) -> list[tuple[float, float]]:
    out, t = [], start
    while t <= end:
        out.append((t, percent))
        t += every
    return out


def job(**kw) -> JobFacts:
    return JobFacts(**{"id": "j", "kind": "jupyter", "gpus": 1, "started_at": NOW - 10_000, **kw})


def test_a_session_idle_for_the_whole_window_is_warned_with_its_numbers():
    v = idle(job(), RULE, {"n/0": series(NOW - 4000, NOW, 1.0)}, NOW, GAP)
    assert v.action is Action.WARN and v.reason == "IdleWarning"
    assert v.params == {"percent": 1.0, "threshold": 5, "window_s": 3600, "grace_s": 600}


def test_a_busy_session_is_not_warned():
    assert idle(job(), RULE, {"n/0": series(NOW - 4000, NOW, 40.0)}, NOW, GAP).reason == "Busy"


def test_one_busy_gpu_of_two_keeps_the_job():
    samples = {"n/0": series(NOW - 4000, NOW, 0.0), "n/1": series(NOW - 4000, NOW, 60.0)}
    assert idle(job(gpus=2), RULE, samples, NOW, GAP).action is Action.NONE


def test_a_gap_in_the_metrics_is_not_idleness():
    gappy = series(NOW - 4000, NOW - 2000, 0.0) + series(NOW - 1000, NOW, 0.0)
    assert idle(job(), RULE, {"n/0": gappy}, NOW, GAP).reason == "NoData"
    # data that begins after the window began, or ends before now, is a gap too
    assert idle(job(), RULE, {"n/0": series(NOW - 3000, NOW, 0.0)}, NOW, GAP).reason == "NoData"
    assert idle(job(), RULE, {"n/0": series(NOW - 4000, NOW - 300, 0.0)}, NOW, GAP).reason == "NoData"
    # no samples at all, or a GPU of the job without any
    assert idle(job(), RULE, {}, NOW, GAP).reason == "NoData"
    assert idle(job(gpus=2), RULE, {"n/0": series(NOW - 4000, NOW, 0.0)}, NOW, GAP).reason == "NoData"


def test_a_job_younger_than_the_window_is_not_judged():
    young = job(started_at=NOW - 1000)
    assert idle(young, RULE, {"n/0": series(NOW - 1000, NOW, 0.0)}, NOW, GAP).reason == "TooYoung"


def test_after_the_grace_period_a_still_idle_session_is_stopped():
    warned = job(idle_warned_at=NOW - 600)
    samples = {"n/0": series(NOW - 5000, NOW, 0.0)}
    assert idle(warned, RULE, samples, NOW - 1, GAP).reason == "Grace"
    v = idle(warned, RULE, samples, NOW, GAP)
    assert (v.action, v.reason) == (Action.STOP, "IdleStopped")


def test_a_session_used_during_the_grace_period_is_not_stopped():
    warned = job(idle_warned_at=NOW - 600)
    samples = {"n/0": series(NOW - 5000, NOW - 300, 0.0) + series(NOW - 290, NOW, 50.0)}
    v = idle(warned, RULE, samples, NOW, GAP)
    assert (v.action, v.reason) == (Action.CLEAR, "BusyAgain")


def test_a_gap_during_the_grace_period_stops_nothing():
    warned = job(idle_warned_at=NOW - 600)
    samples = {"n/0": series(NOW - 5000, NOW - 500, 0.0)}
    assert idle(warned, RULE, samples, NOW, GAP).reason == "NoData"


def test_a_locked_job_is_never_warned_and_a_warning_is_withdrawn():
    samples = {"n/0": series(NOW - 5000, NOW, 0.0)}
    assert idle(job(locked_until=NOW + 1), RULE, samples, NOW, GAP).action is Action.NONE
    v = idle(job(locked_until=NOW + 1, idle_warned_at=NOW - 700), RULE, samples, NOW, GAP)
    assert (v.action, v.reason) == (Action.CLEAR, "Locked")
    # an expired lock protects nothing
    assert idle(job(locked_until=NOW), RULE, samples, NOW, GAP).action is Action.WARN


def test_batch_jobs_are_off_by_default_and_only_flagged_when_on():
    rules = Governance()
    samples = {"n/0": series(NOW - 30_000, NOW, 0.0)}
    batch = job(kind="batch", started_at=NOW - 30_000)
    assert idle(batch, rules.idle_rule("batch"), samples, NOW, GAP).reason == "Off"
    on = rules.idle_batch.model_copy(update={"enabled": True})
    v = idle(batch, on, samples, NOW, GAP)
    assert (v.action, v.reason) == (Action.FLAG, "IdleFlagged")
    assert idle(job(kind="batch", started_at=NOW - 30_000, idle_flagged_at=NOW - 10), on, samples, NOW, GAP).reason == (
        "Flagged"
    )
    stopping = on.model_copy(update={"stop": True})
    assert idle(batch, stopping, samples, NOW, GAP).action is Action.WARN


def test_a_job_without_gpus_is_never_idle():
    assert idle(job(gpus=0), RULE, {}, NOW, GAP).reason == "Off"


def test_covered_needs_every_step_within_the_gap():
    assert covered({"g": [(10.0, 0), (70.0, 0)]}, 1, 0, 100, 60)
    assert not covered({"g": [(10.0, 0), (80.0, 0)]}, 1, 0, 100, 60)


def test_runtime_limit_warns_once_before_and_stops_at_the_limit():
    j = job(started_at=NOW - 3 * 86400)
    limit = 4 * 86400
    assert runtime(j, limit, 86400, NOW - 1).action is Action.NONE
    v = runtime(j, limit, 86400, NOW)
    assert (v.action, v.reason, v.params["left_s"]) == (Action.WARN, "RuntimeLimitWarning", 86400)
    assert runtime(job(started_at=NOW - 3 * 86400, limit_warned_at=NOW), limit, 86400, NOW + 10).action is Action.NONE
    assert runtime(j, limit, 86400, NOW + 86400).reason == "RuntimeLimitReached"
    # an approved extension moves the limit; no limit, no stop
    assert runtime(job(started_at=NOW - 5 * 86400, extended_s=2 * 86400), limit, 0, NOW).action is Action.NONE
    assert runtime(j, None, 86400, NOW + 10**7).reason == "NoLimit"


def test_every_kind_that_is_not_batch_is_an_interactive_session_without_naming_it():
    g = Governance()
    for kind in ("jupyter", "vscode", "a-kind-added-later"):  # an IDE kind, or any later one
        assert g.idle_rule(kind) is g.idle_interactive and g.runtime_limit(kind) == 4 * 86400, kind
    for kind in ("batch", "distributed"):
        assert g.idle_rule(kind) is g.idle_batch and g.runtime_limit(kind) is None, kind
    # a queue that names a kind overrides the interactive default for that kind only
    named = Governance(max_runtime_s={"interactive": 86400, "vscode": 3600, "batch": 7200})
    assert [named.runtime_limit(k) for k in ("jupyter", "vscode", "batch", "distributed")] == [86400, 3600, 7200, None]
