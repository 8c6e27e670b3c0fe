"""A job spec's ``publish``: once the job has succeeded, a folder of its working directory becomes a model version
that records the job, published by the platform through the API's own publish, off the scheduling loop; a job that
fails publishes nothing; a name that is another user's, or a spec that could never publish, is refused at
submission; the outcome is the job's (its API view, its events, its portal page in English and Chinese); and a
publish a stopped server left pending is done at the next start."""

from __future__ import annotations

import pytest

from caldera.server import job_publish
from tests.conftest import api_on, make_settings, wait_for
from tests.fake_runtime import FakeRuntime
from tests.portal import browser_for, post_form
from tests.test_catalogue import _ended, _publish, _upload
from tests.test_files_space_jobs import lab
from tests.test_runs import _until

ZH = {"Accept-Language": "zh-CN"}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    settings = make_settings(tmp_path_factory.mktemp("publish-spec"))
    with api_on(settings, FakeRuntime(settings)) as (api, admin):
        yield api, lab(api, admin, {"vision": ("alice", "dave"), "other": ("bob",), "third": ("carol",)})


def _output(api, h, folder: str, data: bytes = b"trained") -> None:
    """``folder``/out/model.pt in the user's workspace, as a job writes it."""
    for path in (folder, f"{folder}/out"):
        api.client.post("/api/v1/spaces/personal/folders", json={"path": path}, headers=h)
    _upload(api, h, "personal", f"{folder}/out/model.pt", data)


def _train(api, h, workdir: str, publish: dict, command=("true",), account="other"):
    spec = {"name": "train", "command": list(command), "account": account, "workdir": workdir, "publish": publish}
    return api.client.post("/api/v1/jobs", json=spec, headers=h)


def _outcome(api, h, jid):
    """The job's publish once it is no longer pending."""

    def ended():
        got = api.client.get(f"/api/v1/jobs/{jid}", headers=h).json()["publish"]
        return got if got["state"] != "pending" else None

    return wait_for(ended, 60, what=f"the publish of {jid}")


def _events(api, h, jid):
    return {e["reason"]: e["message"] for e in api.client.get(f"/api/v1/jobs/{jid}/events", headers=h).json()}


def test_a_succeeded_jobs_folder_becomes_a_model_version_that_records_it(env):
    api, u = env
    bob = u["bob"]
    _output(api, bob, "run1")
    publish = {"model": "resnet-bob", "framework": "pytorch", "visibility": "public", "description": "ResNet"}
    r = _train(api, bob, "run1", publish)
    assert r.status_code == 201, r.text
    jid = r.json()["id"]
    _until(api, bob, jid, {"Succeeded"})

    assert _outcome(api, bob, jid) == {"state": "published", "ref": f"resnet-bob@{jid}", "left_out": 0}
    entry = api.client.get(f"/api/v1/catalogue/model/resnet-bob@{jid}", headers=bob).json()
    assert (entry["produced_by"], entry["framework"], entry["source"]) == (jid, "pytorch", "personal:bob/run1/out")
    assert (entry["files"], entry["size_bytes"], entry["visibility"]) == (1, 7, "public")
    assert _events(api, bob, jid)["Published"] == f"its folder out was published as model resnet-bob@{jid}"
    # what a reader of the catalogue sees: the job that produced it, mountable by name
    assert api.client.get("/api/v1/catalogue/model/resnet-bob", headers=u["carol"]).json()["produced_by"] == jid

    browser = browser_for(api.client, "bob", "password-123")
    html = browser.get(f"/jobs/{jid}").text
    assert 'id="publish" data-state="published"' in html and "published as model\n  <a" in html
    assert f"resnet-bob@{jid}</a>" in html and f"its folder out was published as model resnet-bob@{jid}" in html
    html = browser.get(f"/jobs/{jid}", headers=ZH).text
    assert "已发布为模型" in html and f"其文件夹 out 已发布为模型 resnet-bob@{jid}" in html


def test_a_failed_job_publishes_nothing_and_a_failed_publish_says_why(env):
    api, u = env
    bob = u["bob"]
    _output(api, bob, "run2")
    failed = _train(api, bob, "run2", {"model": "resnet-bob", "version": "bad-run"}, command=("false",)).json()["id"]
    missing = _train(api, bob, "run3", {"model": "resnet-bob", "version": "nothing"}).json()["id"]
    _until(api, bob, failed, {"Failed"})
    _until(api, bob, missing, {"Succeeded"})

    assert api.client.get(f"/api/v1/jobs/{failed}", headers=bob).json()["publish"] is None
    assert api.client.get("/api/v1/catalogue/model/resnet-bob@bad-run", headers=bob).status_code == 404
    assert not {"Published", "PublishFailed"} & set(_events(api, bob, failed))

    got = _outcome(api, bob, missing)  # its working directory has no out folder
    assert (
        got["state"] == "failed"
        and got["model"] == "resnet-bob"
        and got["error"] == "no folder run3/out in bob's workspace"
    ), got
    assert api.client.get("/api/v1/catalogue/model/resnet-bob@nothing", headers=bob).status_code == 404
    assert "was not published as model resnet-bob" in _events(api, bob, missing)["PublishFailed"]
    html = browser_for(api.client, "bob", "password-123").get(f"/jobs/{missing}", headers=ZH).text
    assert 'data-state="failed"' in html and "未能发布为模型 resnet-bob" in html


def test_a_spec_that_could_not_publish_is_refused_at_submission(env):
    api, u = env
    bob, carol = u["bob"], u["carol"]
    _output(api, bob, "run4")
    r = _train(api, bob, "run4", {"model": "taken-net", "version": "v1"})
    _until(api, bob, r.json()["id"], {"Succeeded"})
    assert _outcome(api, bob, r.json()["id"])["ref"] == "taken-net@v1"

    for who, publish, extra, field, why in (
        (carol, {"model": "taken-net"}, {}, "publish.model", "another user's"),
        (bob, {"model": "taken-net", "version": "v1"}, {}, "publish.version", "exists already"),
        (bob, {"model": "Bad Name"}, {}, "publish.model", "pattern"),
        (bob, {"model": "net", "version": "a/b"}, {}, "publish.version", "pattern"),
        (bob, {"model": "net", "path": "../alice"}, {}, "publish.path", "inside your workspace"),
        (bob, {"model": "net", "path": "/etc"}, {}, "publish.path", "not an absolute path"),
        (bob, {"model": "net", "visibility": "everyone"}, {}, "publish.visibility", "pattern"),
        (bob, {"model": "net", "description": "x" * 4001}, {}, "publish.description", "at most 4000"),
        (bob, {"model": "net", "produced_by": "x"}, {}, "publish.produced_by", "Extra inputs"),
        (bob, {"model": "net"}, {"kind": "jupyter", "command": None}, "body", "batch and distributed"),
    ):
        spec = {"name": "t", "command": ["true"], "account": "third" if who is carol else "other", "publish": publish}
        r = api.client.post("/api/v1/jobs", json={**spec, **extra}, headers=who)
        assert r.status_code == 400, (publish, r.text)
        assert any(e["field"] == field and why in e["reason"] for e in r.json()["errors"]), (publish, r.text)


def test_a_publish_a_stopped_server_left_pending_is_done_at_the_next_start(tmp_path, monkeypatch):
    settings = make_settings(tmp_path)
    with monkeypatch.context() as m, api_on(settings, FakeRuntime(settings)) as (api, admin):
        m.setattr(job_publish.Publisher, "kick", lambda self: None)  # the server stops before it publishes
        bob = lab(api, admin, {"vision": ("alice", "dave"), "other": ("bob",)})["bob"]
        _output(api, bob, "run1")
        jid = _train(api, bob, "run1", {"model": "late-net", "version": "v1"}).json()["id"]
        _until(api, bob, jid, {"Succeeded"})
        assert api.client.get(f"/api/v1/jobs/{jid}", headers=bob).json()["publish"] == {"state": "pending"}
    with api_on(settings, FakeRuntime(settings)) as (api, _):
        bob = api.login("bob", "password-123")
        api.client.app.state.loop.recover()  # what the loop's start does
        assert _outcome(api, bob, jid) == {"state": "published", "ref": "late-net@v1", "left_out": 0}
        assert api.client.get("/api/v1/catalogue/model/late-net@v1", headers=bob).json()["produced_by"] == jid


def test_a_succeeded_jobs_page_publishes_its_output_by_hand_under_the_apis_rules(env):
    """A job without ``publish``: its page (its owner's, once it succeeded) offers the form, prefilled with where it
    worked; the model records the job; a name of another user's is refused on the page; nobody else sees the form
    or may post it."""
    api, u = env
    carol = u["carol"]
    _output(api, carol, "hand")
    r = api.client.post("/api/v1/jobs", json={"name": "by-hand", "command": ["true"], "workdir": "hand"}, headers=carol)
    jid = r.json()["id"]
    _until(api, carol, jid, {"Succeeded"})
    page = browser_for(api.client, "carol", "password-123")
    html = page.get(f"/jobs/{jid}").text
    assert f'action="/jobs/{jid}/publish"' in html and 'name="path" value="hand"' in html
    assert "将其输出发布为模型" in page.get(f"/jobs/{jid}", headers=ZH).text
    bob = browser_for(api.client, "bob", "password-123")
    assert bob.get(f"/jobs/{jid}").status_code == 404
    form = {"path": "hand/out", "name": "carols-net", "version": "v1", "visibility": "private"}
    assert post_form(bob, f"/jobs/{jid}/publish", form).status_code == 404  # not bob's job

    r = post_form(page, f"/jobs/{jid}/publish", form)
    assert r.status_code == 303 and r.headers["location"].startswith("/data?kind=model"), r.text
    entry = wait_for(lambda: (e := api.client.get("/api/v1/catalogue/model/carols-net@v1", headers=carol).json())
                     ["state"] == "ready" and e, 30, what="carols-net@v1 ready")  # fmt: skip
    assert entry["produced_by"] == jid and entry["files"] == 1
    api.client.post("/api/v1/spaces/personal/folders", json={"path": "mine"}, headers=u["bob"])
    _upload(api, u["bob"], "personal", "mine/w.pt", b"bob's")
    r = _publish(api, u["bob"], kind="model", name="bobs-net", version="v1", space="personal", path="mine")
    assert _ended(api, u["bob"], r)["state"] == "ready"
    r = post_form(page, f"/jobs/{jid}/publish", {**form, "name": "bobs-net", "version": "v2"})
    assert r.status_code == 400 and '<ul class="err" role="alert">' in r.text and "another user" in r.text, r.text
