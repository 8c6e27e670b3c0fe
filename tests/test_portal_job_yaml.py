"""The job page's resubmit and YAML download, and the new-job form's YAML view and import, through the real app:
the YAML is the CLI's format (what `caldera submit` sends), and the API's rules decide."""

import pytest
import yaml

from caldera.core.spec import load_spec_yaml
from tests.portal import browser_for, field_errors, post_form

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)

BODY = {"name": "train", "command": ["python", "-c", "print('a b')"], "env": {"A": "1"},
        "resources": {"gpu": 1, "cpu": 2}, "max_runtime_s": 600}  # fmt: skip


@pytest.fixture
def me(api, admin):
    return browser_for(api.client, "admin", "admin-password")


def _submit(api, headers, body=BODY) -> str:
    r = api.client.post("/api/v1/jobs", json=body, headers=headers)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def test_resubmit_a_finished_job_as_a_new_one(api, admin, me):
    jid = _submit(api, admin)
    assert 'id="resubmit"' not in me.get(f"/jobs/{jid}").text  # still queued: nothing to resubmit
    assert post_form(me, f"/jobs/{jid}/resubmit", {}).status_code == 404
    assert post_form(me, f"/jobs/{jid}/cancel", {}).status_code == 303
    assert 'id="resubmit"' in me.get(f"/jobs/{jid}").text
    r = post_form(me, f"/jobs/{jid}/resubmit", {})
    assert r.status_code == 303
    new = r.headers["location"].rsplit("/", 1)[1]
    assert new != jid
    old, again = (api.client.get(f"/api/v1/jobs/{j}", headers=admin).json() for j in (jid, new))
    assert again["state"] == "Queued" and again["spec"] == {**old["spec"], "account": "default", "queue": "default"}


def test_resubmit_refused_by_the_api_opens_the_form_with_its_error(api, admin, me):
    jid = _submit(api, admin)
    post_form(me, f"/jobs/{jid}/cancel", {})
    capped = {"account": "default", "user_caps": {"max_gpus": 0}}
    r = api.client.put("/api/v1/queues/default", json=capped, headers=admin)
    assert r.status_code == 200, r.text
    r = post_form(me, f"/jobs/{jid}/resubmit", {})
    assert r.status_code == 400 and field_errors(r.text, "gpu") and "max_gpus" in field_errors(r.text, "gpu")[0]
    assert 'value="train"' in r.text  # the job, in the form, to change and submit


def test_only_the_owner_resubmits_and_others_get_no_yaml(api, admin, me):
    alice_h = api.user(admin, "alice")
    alice = browser_for(api.client, "alice", "password-123")
    mine = _submit(api, admin)
    post_form(me, f"/jobs/{mine}/cancel", {})
    assert alice.get(f"/jobs/{mine}/job.yaml").status_code == 404
    assert post_form(alice, f"/jobs/{mine}/resubmit", {}).status_code == 404
    hers = _submit(api, alice_h, {"name": "hers", "command": "true"})
    post_form(alice, f"/jobs/{hers}/cancel", {})
    page = me.get(f"/jobs/{hers}").text  # an admin sees her job but does not run it as himself
    assert "hers" in page and 'id="resubmit"' not in page
    assert post_form(me, f"/jobs/{hers}/resubmit", {}).status_code == 404


def test_a_jobs_yaml_submits_the_same_job_through_the_cli_parser(api, admin, me):
    jid = _submit(api, admin)
    r = me.get(f"/jobs/{jid}/job.yaml")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert 'filename="train.yaml"' in r.headers["content-disposition"]
    data = yaml.safe_load(r.text)
    assert data["command"] == "python -c 'print('\"'\"'a b'\"'\"')'"  # one shell string, as people write it
    assert "workdir" not in data  # nothing left at None
    stored = api.client.get(f"/api/v1/jobs/{jid}", headers=admin).json()["spec"]
    assert load_spec_yaml(r.text).model_dump(mode="json") == {**stored, "account": "default", "queue": "default"}


def test_the_form_as_yaml_and_back(api, admin, me):
    form = {"name": "from-form", "command": "echo 'hi there'", "queue": "default", "gpu": "1", "cpu": "2",
            "memory_mib": "2048", "max_runtime_s": "600", "env": "A=1\nB=two words"}  # fmt: skip
    r = post_form(me, "/new/batch/yaml", form)
    assert r.status_code == 200, r.text
    data = yaml.safe_load(r.text)
    assert data["command"] == "echo 'hi there'" and data["env"] == {"A": "1", "B": "two words"}
    assert data["resources"]["gpu"] == 1 and data["queue"] == "default" and data["kind"] == "batch"

    r = post_form(me, "/new/jupyter/import", {"yaml": r.text})  # the file's kind wins over the page's
    assert r.status_code == 200
    assert 'action="/new/batch"' in r.text and 'value="from-form"' in r.text
    assert 'value="echo &#39;hi there&#39;"' in r.text and ">A=1\nB=two words</textarea>" in r.text
    assert 'value="600"' in r.text and '<option value="1" selected>1</option>' in r.text

    r = post_form(me, "/new/batch/yaml", {**form, "name": "bad name!"})  # the spec's rules, next to the field
    assert r.status_code == 400 and field_errors(r.text, "name")


def test_import_shows_the_parsers_errors_and_keeps_the_text(api, admin, me):
    cases = {
        "name: [unclosed": "not valid YAML",
        "- a list": "expected a mapping",
        "name: x\ncommand: true\nresources: {gpu: true}": "a number is expected",
        "name: x\nkind: batch\nsurprise: 1": "surprise",
    }
    for text, reason in cases.items():
        r = post_form(me, "/new/batch/import", {"yaml": text})
        assert r.status_code == 400, text
        errors = field_errors(r.text, "yaml")
        assert errors and reason in " ".join(errors), (text, errors)
    assert "surprise: 1</textarea>" in r.text
    r = post_form(me, "/new/batch/import", {"yaml": "x" * 200_000})  # over the size limit: refused before parsing
    assert r.status_code == 400 and "at most 131072 characters" in r.text
