"""Jobs and storage spaces: a job mounts an account's space read-write when its user may write there (a member
with mode rw, an admin), and only then; a space a running job sees cannot be deleted. The whole permission matrix
through the API, with what the runtime was asked to mount."""

from __future__ import annotations

import pytest

from tests.conftest import Api, api_on, make_settings
from tests.fake_runtime import FakeRuntime
from tests.test_runs import _until


def lab(api: Api, admin, accounts: dict[str, tuple[str, ...]]) -> dict[str, dict[str, str]]:
    """Users in accounts (``{account: members}``), dave a read-only member of account:vision; everyone's headers."""
    users = {"admin": admin}
    for account, members in accounts.items():
        api.client.post("/api/v1/accounts", json={"name": account}, headers=admin)
        for name in members:
            users[name] = api.user(admin, name)
            r = api.client.post(f"/api/v1/accounts/{account}/members", json={"username": name}, headers=admin)
            assert r.status_code == 201, r.text
    r = api.client.put("/api/v1/spaces/account:vision/members/dave", json={"mode": "ro"}, headers=admin)
    assert r.status_code == 200, r.text
    return users


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    settings = make_settings(tmp_path_factory.mktemp("space-jobs"))
    runtime = FakeRuntime(settings)
    with api_on(settings, runtime) as (api, admin):
        yield api, lab(api, admin, {"vision": ("alice", "dave"), "other": ("bob",)}), runtime


def _submit(api: Api, headers, mounts: list[dict], account: str | None = None):
    spec = {"name": "m", "command": ["sleep", "30"], "mounts": mounts, **({"account": account} if account else {})}
    return api.client.post("/api/v1/jobs", json=spec, headers=headers)


# who: (may mount read-only, may mount writable, the reason when refused)
MATRIX = {
    "alice": (True, True, ""),  # a member, rw (the default)
    "dave": (True, False, "you may read account:vision but not change it"),  # a member an admin made ro
    "bob": (False, False, "you have no access to account:vision"),  # not a member
    "admin": (True, True, ""),
}


@pytest.mark.parametrize("who", MATRIX)
@pytest.mark.parametrize("writable", [False, True])
def test_an_account_space_is_mounted_writable_exactly_when_its_user_may_write_it(env, who, writable):
    api, users, runtime = env
    allowed = MATRIX[who][1] if writable else MATRIX[who][0]
    account = "other" if who == "bob" else "vision"
    r = _submit(api, users[who], [{"space": "account:vision", "at": "/data/vision", "writable": writable}], account)
    if not allowed:
        assert r.status_code == 400, r.text
        assert r.json()["errors"] == [{"field": "mounts.0.space", "reason": MATRIX[who][2]}]
        return
    assert r.status_code == 201, r.text
    jid = r.json()["id"]
    _until(api, users[who], jid, {"Running"})
    launched = next(req for req in runtime.launched if req.job_id == jid)
    host, at, rw = launched.mounts[0]
    assert (at, rw) == ("/data/vision", writable) and host.endswith("/account/vision/data")
    api.client.post(f"/api/v1/jobs/{jid}/cancel", headers=users[who])


def test_a_space_a_running_job_sees_is_not_deleted(env):
    api, users, _ = env
    admin, alice = users["admin"], users["alice"]
    r = api.client.post("/api/v1/spaces/account:vision/folders", json={"path": "kept"}, headers=admin)
    assert r.status_code == 201, r.text
    r = _submit(api, alice, [{"space": "account:vision", "at": "/data/v"}, {"space": "public", "at": "/mnt/p"}])
    jid = r.json()["id"]
    _until(api, alice, jid, {"Running"})
    for space in ("account:vision", "public", "personal:alice"):  # mounted, mounted, every job's working directory
        r = api.client.delete(f"/api/v1/spaces/{space}", headers=admin)
        assert (
            r.status_code == 409
            and r.json()["detail"] == f"{space} is in use by running jobs {jid}: delete it once they end"
        )
    assert api.client.delete("/api/v1/spaces/account:vision", headers=alice).status_code == 403  # admins only
    names = [e["name"] for e in api.client.get("/api/v1/spaces/account:vision/list", headers=admin).json()["entries"]]
    assert "kept" in names
    api.client.post(f"/api/v1/jobs/{jid}/cancel", headers=alice)
    _until(api, alice, jid, {"Cancelled"})
    r = api.client.delete("/api/v1/spaces/account:vision", headers=admin)
    assert r.status_code == 200 and r.json()["freed_files"] >= 1, r.text
    r = api.client.get("/api/v1/spaces/account:vision/list", headers=admin)
    assert r.json()["entries"] == []


def test_the_refusal_reads_in_chinese_in_the_portal():
    from caldera.errors import Conflict
    from caldera.server.web import i18n
    from caldera.server.web.api_call import errors_of
    from caldera.server.web.reason_text import Say

    exc = Conflict("x", "SpaceInUse", {"space": "public", "jobs": "j1, j2"})
    (row,) = errors_of(exc)
    assert (
        Say(i18n.translations("zh").gettext).reason(row) == "public 正被运行中的作业 j1, j2 使用：请在它们结束后再删除"
    )
