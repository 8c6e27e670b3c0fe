"""`/api/v1/accounting`, sacct-like: one row per job that ended in the window with the GPU-hours the loop charged
it; admins see everyone's jobs, users their own."""

import pytest

from tests.test_runs import _submit, _until

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
TINY = {"cpu": 0.1, "memory_mib": 64}


def _accounting(api, h, **params) -> dict:
    r = api.client.get("/api/v1/accounting", params=params, headers=h)
    assert r.status_code == 200, r.text
    return r.json()


def test_accounting_rows_gpu_hours_and_visibility(api, admin):
    alice = api.user(admin, "alice")
    gpu_job = _submit(api, admin, name="on-gpu", command=["sleep", "2"], resources={**TINY, "gpu": 1})
    theirs = _submit(api, alice, name="theirs", command=["sh", "-c", "exit 4"], resources=TINY)
    running = _submit(api, alice, name="still-running", command=["sleep", "60"], resources=TINY)
    _until(api, admin, gpu_job, {"Succeeded"})
    _until(api, alice, theirs, {"Failed"})
    _until(api, alice, running, {"Running"})

    rows = {j["id"]: j for j in _accounting(api, admin, since="1d")["jobs"]}
    assert set(rows) == {gpu_job, theirs}  # ended jobs only, everyone's
    g = rows[gpu_job]
    got = [g[k] for k in ("user", "account", "queue", "state", "gpus")]
    assert got == ["admin", "default", "default", "Succeeded", 1]
    assert g["start"] < g["end"] and 2 / 3600 <= g["gpu_hours"] <= (g["end"] - g["start"] + 1) / 3600
    assert rows[theirs]["gpu_hours"] == 0 and rows[theirs]["exit_code"] == 4  # no GPU asked, none charged

    assert [j["id"] for j in _accounting(api, alice)["jobs"]] == [theirs]  # a user: their own
    assert _accounting(api, admin, since="2099-01-01")["jobs"] == []
    r = api.client.get("/api/v1/accounting", params={"since": "forever"}, headers=admin)
    assert r.status_code in (400, 422) and "since" in r.text
    api.client.post(f"/api/v1/jobs/{running}/cancel", headers=alice)
    _until(api, alice, running, {"Cancelled"})
    assert {j["id"] for j in _accounting(api, alice, since="1h")["jobs"]} == {theirs, running}
