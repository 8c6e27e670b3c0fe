"""A restart that changes the default runtime loses no job: every attempt stays with the runtime that launched it
(re-attach, stop, logs, lab endpoints), new launches go to the new default, and an attempt no runtime can read is
Lost only once its processes were found and ended, its GPUs held until then."""

from __future__ import annotations

from contextlib import contextmanager

from caldera.runtime.container.runtime import ContainerRuntime
from caldera.runtime.local import procs
from caldera.runtime.local.runtime import LocalRuntime
from tests import needs
from tests.conftest import api_on, make_settings, wait_for
from tests.test_runs import _log, _submit, _until

TICKER = ["sh", "-c", 'i=0; while :; do echo "tick $i"; i=$((i+1)); sleep 0.2; done']


@contextmanager
def _server(settings, runtime):
    """One server life on the data directory: the app with its loop, after the restart's re-attach."""
    with api_on(settings, runtime) as (api, admin):
        api.client.app.state.loop.recover()
        yield api, admin


def _events(api, admin, jid):
    return [e["reason"] for e in api.client.get(f"/api/v1/jobs/{jid}", headers=admin).json()["events"]]


def _restart_keeps_jobs(tmp_path, first, second) -> None:
    """Jobs launched under ``first`` run on under ``second`` as before; a job launched under ``second`` runs there."""
    tmp_path.mkdir()
    settings = make_settings(tmp_path)
    with _server(settings, first(settings)) as (api, admin):
        done = _submit(api, admin, name="done", command=["sh", "-c", "seq 1 2000"])
        running = _submit(api, admin, name="running", command=TICKER, resources={"gpu": 1})
        _until(api, admin, done, {"Succeeded"})
        _until(api, admin, running, {"Running"})
        wait_for(lambda: "tick 3" in _log(api, admin, running), what="the ticker's output")
        done_log = _log(api, admin, done)
    assert done_log.splitlines()[-1] == "2000"

    with _server(settings, second(settings)) as (api, admin):
        loop = api.client.app.state.loop
        assert _until(api, admin, running, {"Running"})["state"] == "Running"
        assert "Reattached" in _events(api, admin, running)
        assert _log(api, admin, done) == done_log  # read by the runtime that wrote it, byte for byte
        assert "tick 3" in _log(api, admin, running)
        # its GPU stays its own: a new job of the new runtime gets another one
        new = _submit(api, admin, name="new", command=TICKER, resources={"gpu": 1})
        _until(api, admin, new, {"Running"})
        jobs = {j["id"]: j for j in api.client.get("/api/v1/jobs", headers=admin).json()}
        gpus = [tuple(a["gpus"]) for jid in (running, new) for a in jobs[jid]["allocations"]]
        assert len(set(gpus)) == 2, gpus
        with loop.p.session() as db:
            from caldera.db.models import Job

            assert (db.get(Job, running).runtime, db.get(Job, new).runtime) == (first.name, second.name)
        for jid in (running, new):  # stop reaches each through its own runtime
            api.client.post(f"/api/v1/jobs/{jid}/cancel", headers=admin)
        for jid in (running, new):
            assert _until(api, admin, jid, {"Cancelled"})["state"] == "Cancelled"
        assert not procs.job_processes(set(), tag_prefix=f"{running}/")


def test_restart_from_process_to_container_runtime_and_back(tmp_path) -> None:
    needs.podman()
    _restart_keeps_jobs(tmp_path / "there", LocalRuntime, ContainerRuntime)
    _restart_keeps_jobs(tmp_path / "back", ContainerRuntime, LocalRuntime)


def test_a_lab_of_the_process_runtime_keeps_its_endpoint_after_the_default_changes(tmp_path) -> None:
    needs.podman()
    needs.module("jupyterlab")
    settings = make_settings(tmp_path)
    with _server(settings, LocalRuntime(settings)) as (api, admin):
        lab = _submit(api, admin, name="lab", kind="jupyter")
        _until(api, admin, lab, {"Running"}, timeout=120)
    with _server(settings, ContainerRuntime(settings)) as (api, admin):
        p = api.client.app.state.platform
        _until(api, admin, lab, {"Running"})
        from caldera.db.models import Job
        from caldera.runtime.base import Handle

        with p.session() as db:
            job = db.get(Job, lab)
            runtime, handle = p.runtime_of(job.runtime, job.handle), Handle(job.id, job.attempt, job.handle)
        assert runtime.name == "local"
        eps = wait_for(lambda: runtime.endpoints(handle), timeout=60, what="the lab's endpoint")
        assert eps[0].socket and eps[0].socket.endswith("lab.sock")
        api.client.post(f"/api/v1/jobs/{lab}/cancel", headers=admin)
        _until(api, admin, lab, {"Cancelled"})


def test_an_unreadable_record_holds_its_gpus_until_its_processes_are_ended(tmp_path, monkeypatch) -> None:
    settings = make_settings(tmp_path, gpus=1)
    with _server(settings, LocalRuntime(settings)) as (api, admin):
        victim = _submit(api, admin, name="victim", command=TICKER, resources={"gpu": 1})
        _until(api, admin, victim, {"Running"})
        p = api.client.app.state.platform
        from caldera.db.models import Job

        with p.session() as db:  # a record the runtime cannot parse (a bug, a hand edit, another version's format)
            job = db.get(Job, victim)
            job.handle = {**job.handle, "ranks": "not a list"}
            db.commit()
    assert procs.job_processes(set(), tag_prefix=f"{victim}/1/")  # still running: nobody stopped it

    # a runtime that cannot end it: the job stays active and keeps its GPU
    monkeypatch.setattr(LocalRuntime, "end_attempt", lambda self, job_id, attempt: False)
    with _server(settings, LocalRuntime(settings)) as (api, admin):
        waiting = _submit(api, admin, name="waiting", command=["true"], resources={"gpu": 1})
        loop = api.client.app.state.loop
        for _ in range(3):
            loop.tick()
        job = api.client.get(f"/api/v1/jobs/{victim}", headers=admin).json()
        assert job["state"] == "Running" and "Unobservable" in [e["reason"] for e in job["events"]]
        assert api.client.get(f"/api/v1/jobs/{waiting}", headers=admin).json()["state"] == "Queued"
    monkeypatch.undo()

    # the runtime finds its processes by their run tag and ends them: only then Lost, and the GPU is free again
    with _server(settings, LocalRuntime(settings)) as (api, admin):
        job = api.client.get(f"/api/v1/jobs/{victim}", headers=admin).json()
        assert job["state"] == "Lost" and job["reason"] == "ReattachFailed", job
        assert "found and ended" in job["message"]
        assert not procs.job_processes(set(), tag_prefix=f"{victim}/1/")
        assert _until(api, admin, waiting, {"Succeeded"})["state"] == "Succeeded"


def test_an_attempt_of_a_runtime_that_cannot_start_here_is_a_clear_error_not_a_500(tmp_path) -> None:
    settings = make_settings(tmp_path)
    with _server(settings, LocalRuntime(settings)) as (api, admin):
        jid = _submit(api, admin, name="done", command=["echo", "hi"])
        _until(api, admin, jid, {"Succeeded"})
        from caldera.db.models import Job

        p = api.client.app.state.platform
        with p.session() as db:  # launched by a runtime this server cannot make (not installed, say)
            db.get(Job, jid).runtime = "nosuch"
            db.commit()
        r = api.client.get(f"/api/v1/jobs/{jid}/logs", headers=admin)
        assert r.status_code == 502 and "unknown runtime 'nosuch'" in r.text, r.text
