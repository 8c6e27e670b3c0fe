"""A lab opens in its owner's workspace: a notebook saved in one session is there in the next."""

from __future__ import annotations

import httpx

from caldera.db.models import Job
from caldera.runtime.base import Handle
from caldera.runtime.local.runtime import LocalRuntime
from tests import needs
from tests.conftest import api_on, make_settings, wait_for
from tests.test_runs import _submit, _until

NOTEBOOK = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def _lab(api, admin, **spec) -> tuple[str, httpx.Client, dict[str, str], str]:
    """A running lab of the admin's and a client on its socket, logged in as the platform's proxy would be."""
    jid = _submit(api, admin, name="lab", kind="jupyter", **spec)
    _until(api, admin, jid, {"Running"}, timeout=120)
    p = api.client.app.state.platform
    with p.session() as db:
        job = db.get(Job, jid)
        runtime, handle = p.runtime_of(job.runtime, job.handle), Handle(jid, job.attempt, job.handle)
    ep = wait_for(lambda: runtime.endpoints(handle), timeout=60, what="the lab's endpoint")[0]
    http = httpx.Client(transport=httpx.HTTPTransport(uds=ep.socket), base_url="http://localhost", timeout=30)
    http.get(ep.base_url + "lab", headers=ep.headers)
    xsrf = http.cookies["_xsrf"]
    headers = {"Cookie": f"{ep.headers['Cookie']}; _xsrf={xsrf}", "X-XSRFToken": xsrf}
    return jid, http, headers, ep.base_url


def _stop(api, admin, jid: str) -> None:
    api.client.post(f"/api/v1/jobs/{jid}/cancel", headers=admin)
    _until(api, admin, jid, {"Cancelled"})


def test_a_notebook_saved_in_one_session_opens_in_the_next(tmp_path) -> None:
    needs.module("jupyterlab")
    settings = make_settings(tmp_path)
    with api_on(settings, LocalRuntime(settings)) as (api, admin):
        jid, http, headers, base = _lab(api, admin)
        saved = {"type": "notebook", "content": NOTEBOOK}
        r = http.put(f"{base}api/contents/thesis.ipynb", json=saved, headers=headers)
        assert r.status_code in (200, 201), r.text
        _stop(api, admin, jid)
        assert (settings.workspaces / "admin" / "thesis.ipynb").is_file()  # in the workspace, not a job's folder

        jid, http, headers, base = _lab(api, admin)
        r = http.get(f"{base}api/contents/thesis.ipynb", headers=headers)
        assert r.status_code == 200 and r.json()["content"]["nbformat"] == 4
        _stop(api, admin, jid)

        # a working directory of the form's, inside the workspace: the lab opens there
        jid, http, headers, base = _lab(api, admin, workdir="projects/thesis")
        listing = http.get(f"{base}api/contents", headers=headers).json()
        assert listing["path"] == "" and not any(c["name"] == "thesis.ipynb" for c in listing["content"])
        _stop(api, admin, jid)
        assert (settings.workspaces / "admin" / "projects" / "thesis").is_dir()
