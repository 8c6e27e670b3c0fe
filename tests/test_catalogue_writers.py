"""Write grants on a catalogue name: its owner (or an admin) lets users and accounts' members publish new versions
under it; nobody else says who, sees the list, or publishes there; each version stays its publisher's, read-only
and unchanging; taking the grant back stops the next publish. Through the API and the CLI."""

from __future__ import annotations

import json

import pytest

from tests.conftest import api_on, make_settings
from tests.fake_runtime import FakeRuntime
from tests.test_catalogue import _ended, _publish, _upload
from tests.test_catalogue_cli import server  # noqa: F401 - fixture
from tests.test_files_space_jobs import lab
from tests.test_server_process import cli


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    settings = make_settings(tmp_path_factory.mktemp("writers"))
    with api_on(settings, FakeRuntime(settings)) as (api, admin):
        users = lab(api, admin, {"vision": ("alice", "dave"), "other": ("bob",), "third": ("carol",)})
        for who in ("alice", "bob", "carol", "dave"):
            _upload(api, users[who], "personal", f"{who}.bin", who.encode())
        yield api, users


def _version(api, h, version: str):
    """The publish's answer, once its copy ended when it was taken."""
    r = _publish(api, h, name="lab-set", version=version, space="personal", path="", visibility="public")
    if r.status_code == 202:
        assert _ended(api, h, r)["state"] == "ready"
    return r


def _writers(api, h, writers=None):
    url = "/api/v1/catalogue/dataset/lab-set/writers"
    if writers is None:
        return api.client.get(url, headers=h)
    return api.client.put(url, json={"writers": writers}, headers=h)


def test_the_owner_grants_and_takes_back_who_publishes_under_a_name(env):
    api, u = env
    assert _version(api, u["alice"], "v1").status_code == 202
    r = _version(api, u["bob"], "v2")
    assert r.status_code == 403 and "another user's" in r.text, r.text
    for who in ("bob", "dave"):  # neither sees nor sets the list, a member of the owner's account included
        assert _writers(api, u[who]).status_code == 403
        assert _writers(api, u[who], [f"user:{who}"]).status_code == 403
    assert _writers(api, u["alice"]).json() == {"kind": "dataset", "name": "lab-set", "owner": "alice", "writers": []}

    assert _writers(api, u["alice"], ["user:bob", "account:third", "user:bob"]).json()["writers"] == [
        "account:third",
        "user:bob",
    ]
    r = _version(api, u["bob"], "v2")
    assert r.status_code == 202 and r.json()["owner"] == "bob", r.text
    assert _version(api, u["carol"], "v3").status_code == 202  # a member of account third
    assert _version(api, u["dave"], "v4").status_code == 403  # not granted: alice's account is not enough
    newest = api.client.get("/api/v1/catalogue/dataset/lab-set", headers=u["dave"]).json()
    assert newest["version"] == "v3" and newest["owner"] == "carol"
    # a granted version is its publisher's: alice cannot delete bob's, bob can
    assert api.client.delete("/api/v1/catalogue/dataset/lab-set/v2", headers=u["alice"]).status_code == 403
    assert api.client.delete("/api/v1/catalogue/dataset/lab-set/v2", headers=u["bob"]).status_code == 200
    # a writer does not grant in turn; an admin may
    assert _writers(api, u["bob"], ["user:dave"]).status_code == 403
    assert _writers(api, u["admin"], ["user:bob"]).json()["writers"] == ["user:bob"]
    assert _version(api, u["carol"], "v5").status_code == 403  # account third taken back by the admin's list
    assert _writers(api, u["alice"], []).json()["writers"] == []
    assert _version(api, u["bob"], "v6").status_code == 403


def test_a_grant_takes_only_user_and_account_names_and_a_name_that_exists(env):
    api, u = env
    for bad in (["bob"], ["user:"], ["group:x"], ["user:bob\n"], ["user:../x"], ["user:x"] * 300):
        r = _writers(api, u["alice"], bad)
        assert r.status_code in (400, 422), (bad, r.text)
    r = api.client.put("/api/v1/catalogue/dataset/no-such-name/writers", json={"writers": []}, headers=u["alice"])
    assert r.status_code == 404, r.text
    r = api.client.put("/api/v1/catalogue/dataset/lab-set/writers", json={"writers": [], "owner": "bob"},
                       headers=u["alice"])  # fmt: skip
    assert r.status_code in (400, 422)  # no other field: the owner never changes this way


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_cli_shows_and_sets_the_writers(server):  # noqa: F811
    cli(server, "login", "--url", server.url, "-u", "admin", "-p", "admin-password")
    cli(server, "files", "mkdir", "set")
    cli(server, "data", "publish", "cli-set", "v1", "--path", "set")
    assert "admin, and nobody else" in cli(server, "data", "writers", "cli-set").stdout
    cli(server, "data", "writers", "cli-set", "user:bob", "account:vision")
    got = json.loads(cli(server, "data", "writers", "cli-set", "-o", "json").stdout)
    assert got["writers"] == ["account:vision", "user:bob"]
    assert "nobody else" in cli(server, "data", "writers", "cli-set", "--clear").stdout
    refused = cli(server, "data", "writers", "cli-set", "bob", check=False)
    assert refused.returncode == 1
