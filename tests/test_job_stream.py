"""A job's server-sent event stream (state changes and the log on one connection): what it sends for a finished
job, resuming from Last-Event-ID, characters cut between two reads, who may open it, and live through a real server."""

from __future__ import annotations

import json
import time

import httpx

from caldera.db.models import Job
from tests.test_runs import _submit, _until
from tests.test_server_process import token


def parse_sse(lines) -> list[dict]:
    """Events as dicts (event, data decoded from JSON, id, t: when the event's last line arrived)."""
    out, cur = [], {}
    for line in lines:
        if line == "":
            if "event" in cur:
                out.append(cur)
            cur = {}
        elif line.startswith("event: "):
            cur["event"] = line[7:]
        elif line.startswith("data: "):
            cur["data"], cur["t"] = json.loads(line[6:]), time.monotonic()
        elif line.startswith("id: "):
            cur["id"] = line[4:]
    return out


def _events(api, headers, jid, **extra_headers) -> list[dict]:
    r = api.client.get(f"/api/v1/jobs/{jid}/stream", headers={**headers, **extra_headers})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.text
    return parse_sse(r.text.split("\n"))


def _log_text(events) -> str:
    return "".join(e["data"] for e in events if e["event"] == "log")


def test_a_finished_job_streams_its_state_its_whole_log_then_end(api, admin):
    jid = _submit(api, admin, name="talk", command=["sh", "-c", "echo first; echo second"])
    _until(api, admin, jid, {"Succeeded"})
    events = _events(api, admin, jid)
    assert events[0]["event"] == "state" and events[0]["data"]["state"] == "Succeeded"
    assert events[-1] == {**events[-1], "event": "end"} and events[-1]["data"]["exit_code"] == 0
    assert _log_text(events) == "first\nsecond\n"
    assert [e["event"] for e in events].count("end") == 1

    # a reconnect resumes after the bytes it had: the id is attempt:offset
    last_log = [e for e in events if e["event"] == "log"][-1]
    attempt = events[0]["data"]["attempt"]
    assert last_log["id"] == f"{attempt}:13"
    assert _log_text(_events(api, admin, jid, **{"Last-Event-ID": f"{attempt}:6"})) == "second\n"
    for junk in ("nonsense", "0:-5", "-1:0", "0:99999999999999999999"):  # not one of ours: from the start
        assert _log_text(_events(api, admin, jid, **{"Last-Event-ID": junk})) == "first\nsecond\n", junk
    assert api.client.get(f"/api/v1/jobs/{jid}/stream?rank=3", headers=admin).status_code == 400
    long_id = {**admin, "Last-Event-ID": "9" * 100}
    assert api.client.get(f"/api/v1/jobs/{jid}/stream", headers=long_id).status_code == 400


def test_another_users_job_has_no_stream(api, admin):
    jid = _submit(api, admin, name="private", command=["echo", "secret output"])
    _until(api, admin, jid, {"Succeeded"})
    mallory = api.user(admin, "mallory")
    r = api.client.get(f"/api/v1/jobs/{jid}/stream", headers=mallory)
    assert r.status_code == 404 and "secret" not in r.text
    assert api.client.get(f"/api/v1/jobs/{jid}/stream").status_code == 401


def test_a_character_cut_between_two_reads_arrives_whole(api, admin, platform, monkeypatch):
    jid = _submit(api, admin, name="utf8", command=["true"])
    _until(api, admin, jid, {"Succeeded"})
    reads = {0: [b"caf\xc3", b"\xa9 ok\n"], 3: [b"\xc3\xa9 ok\n"], 9: []}
    monkeypatch.setattr(platform.runtime, "logs", lambda handle, rank=None, offset=0, **_: iter(reads[offset]))
    logs = [e for e in _events(api, admin, jid) if e["event"] == "log"]
    a = platform.session().get(Job, jid).attempt
    assert [(e["data"], e["id"]) for e in logs] == [("caf", f"{a}:3"), ("é ok\n", f"{a}:9")]
    # resuming at the id of the first event re-reads the cut character's first byte
    assert _log_text(_events(api, admin, jid, **{"Last-Event-ID": f"{a}:3"})) == "é ok\n"


def test_live_through_a_real_server_states_and_lines_as_they_happen(server):
    h = token(server)
    spec = {"name": "live", "command": ["sh", "-c", "echo one; sleep 2; echo two"]}
    jid = httpx.post(f"{server.url}/api/v1/jobs", json=spec, headers=h).json()["id"]
    with httpx.stream("GET", f"{server.url}/api/v1/jobs/{jid}/stream", headers=h, timeout=60) as r:
        assert r.status_code == 200
        events = parse_sse(r.iter_lines())
    states = [e["data"]["state"] for e in events if e["event"] == "state"]
    assert states[-1] == "Succeeded" and "Running" in states, states
    logs = [e for e in events if e["event"] == "log"]
    assert "".join(e["data"] for e in logs) == "one\ntwo\n"
    one = next(e for e in logs if "one" in e["data"])
    two = next(e for e in logs if "two" in e["data"])
    assert two["t"] - one["t"] > 1.0  # "one" came while the job still slept: streamed, not sent at the end
    before_one = [e["data"]["state"] for e in events[: events.index(one)] if e["event"] == "state"]
    assert before_one[-1] in ("Starting", "Running"), before_one  # the log came with the job, not at its end
    assert events[-1]["event"] == "end"
