"""The caldera policy through the live loop: why-pending via the API, queue validation, and the preemption contract
(SIGTERM + notice file with the deadline, grace, re-queue in the same working directory)."""

from tests.test_runs import _submit, _until


def test_queue_capability_shows_in_why(api, admin):
    r = api.client.put(
        "/api/v1/queues/default", json={"account": "default", "quotas": {"gpu": {"capability": 2}}}, headers=admin
    )
    assert r.status_code == 200, r.text
    first = _submit(api, admin, name="a", command=["sleep", "30"], resources={"gpu": 2})
    second = _submit(api, admin, name="b", command=["true"], resources={"gpu": 1})
    _until(api, admin, first, {"Running"})
    api.client.app.state.loop.tick()
    why = api.client.get(f"/api/v1/jobs/{second}/why", headers=admin).json()
    codes = [p["code"] for p in why["pending"]]
    assert "QueueCapability" in codes, why
    detail = next(p for p in why["pending"] if p["code"] == "QueueCapability")
    assert "2 of 2" in detail["message"]
    api.client.post(f"/api/v1/jobs/{first}/cancel", headers=admin)


def test_impossible_queue_config_is_refused(api, admin):
    for quotas in (
        {"gpu": {"guarantee": 64}},
        {"gpu": {"guarantee": 2, "capability": 1}},
        {"gpu/h100": {"guarantee": 1}},
    ):
        r = api.client.put("/api/v1/queues/default", json={"account": "default", "quotas": quotas}, headers=admin)
        assert r.status_code == 400, (quotas, r.text)
        assert r.json()["errors"][0]["field"] == "quotas"


def test_best_effort_is_preempted_with_notice_and_requeued(api, admin):
    script = (
        'echo "attempt $CALDERA_ATTEMPT in $PWD"; '
        "trap 'cat \"$CALDERA_PREEMPT_NOTICE\" > notice-seen; exit 0' TERM; sleep 120 & wait"
    )
    be = _submit(api, admin, name="be", command=["sh", "-c", script], priority="best-effort", resources={"gpu": 4})
    _until(api, admin, be, {"Running"})
    urgent = _submit(api, admin, name="urgent", command=["echo", "mine now"], resources={"gpu": 2})
    j = _until(api, admin, be, {"Queued"}, timeout=60)
    reasons = [e["reason"] for e in j["events"]]
    assert "PreemptionRequested" in reasons and "Requeued" in reasons, reasons
    pre = next(e for e in j["events"] if e["to"] == "Preempted")
    assert pre["reason"] == "BestEffort" and urgent in pre["message"]
    assert _until(api, admin, urgent, {"Succeeded"})["state"] == "Succeeded"
    again = _until(api, admin, be, {"Running"})
    assert again["attempt"] == 2
    from pathlib import Path

    workdir = Path(api.client.app.state.platform.settings.workspaces) / "admin" / "jobs" / be
    notice = (workdir / "notice-seen").read_text()  # written by the job, as its owner, in its owner's space
    assert "deadline" in notice and urgent in notice
    api.client.post(f"/api/v1/jobs/{be}/cancel", headers=admin)
    _until(api, admin, be, {"Cancelled"})


def test_stored_reasons_are_rewritten_when_what_a_person_reads_changes():
    from caldera.server.loop import reasons_changed

    def pos(position, start, message_time="10:05"):
        return {
            "code": "QueuePosition",
            "message": f"position {position} in the queue, estimated start at {message_time}",
            "details": {"position": position, "estimated_start": start},
        }

    stored = [pos(3, 1000.0)]
    assert not reasons_changed(stored, [pos(3, 1001.5)])  # the estimate drifted within the minute
    assert reasons_changed(stored, [pos(3, 1061.0, "10:06")])  # the minute shown changed
    assert reasons_changed(stored, [pos(2, 1000.0)])  # moved up the queue
    blocked = {
        "code": "GangNoFit",
        "message": "needs 4 GPUs on one node and the largest free block is 2",
        "details": {"largest_free_block": 2},
    }
    assert reasons_changed(stored, [blocked, pos(3, 1000.0)])  # a new reason in front
    assert reasons_changed(
        [blocked, pos(3, 1000.0)], [{**blocked, "details": {"largest_free_block": 3}}, pos(3, 1000.0)]
    )
    assert reasons_changed([], [pos(1, 1000.0)])
