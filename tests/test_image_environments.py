"""Issue 22, a default environment: the admins' catalogue of ready environments and base images (what the build
form and the job form offer, each with what is inside and whether it is on this host), the CUDA and cuDNN choices
that cannot work together refused when the form is sent, with the reason in the reader's language, and the wheels
of every choice the form offers published for every Python it offers (checked against PyPI)."""

from __future__ import annotations

import html
import re

import httpx
import pytest
from packaging.specifiers import SpecifierSet
from packaging.utils import parse_wheel_filename
from packaging.version import Version

from caldera.db.models import AdminAudit, Image
from caldera.images.form import CUDA, CUDNN, PYTHONS
from caldera.server.web import i18n
from tests import needs
from tests.conftest import make_settings
from tests.images_fixtures import registry_port  # noqa: F401 - fixture
from tests.portal import browser_for, post_form

GOOD = {"name": "tools", "pip": ["six"]}
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"


@pytest.fixture
def settings(tmp_path, db_url, registry_port):  # noqa: F811
    return make_settings(tmp_path, db_url, **registry_port)


@pytest.fixture
def here(api, monkeypatch):
    """The images this host has, as the builder sees them: a set the test changes."""
    images = {"caldera/base:bookworm", "caldera/base:bullseye", "caldera/default:bookworm"}
    monkeypatch.setattr(api.client.app.state.builds.builder, "has", lambda ref: ref in images)
    return images


@pytest.fixture
def ana(api, admin):
    api.client.post("/api/v1/accounts", json={"name": "lab"}, headers=admin)
    return api.user(admin, "ana", default_account="lab")


def test_the_catalogue_lists_what_bootstrap_makes_and_says_how_to_make_what_is_missing(api, ana, here):
    rows = {e["ref"]: e for e in api.client.get("/api/v1/images/environments", headers=ana).json()}
    assert rows["caldera/default:bookworm"] == {
        "ref": "caldera/default:bookworm", "kind": "ready", "python": "3.11", "cuda": "none",
        "inside": "JupyterLab, ipykernel, numpy", "present": True, "makes_it": None,
    }  # fmt: skip
    assert rows["caldera/pytorch:bookworm"]["present"] is False
    assert rows["caldera/pytorch:bookworm"]["makes_it"] == "caldera images bootstrap --suite bookworm --ready pytorch"
    assert rows["caldera/base:trixie"]["makes_it"] == "caldera images bootstrap --suite trixie --ready none"
    assert {e["python"] for e in rows.values() if e["kind"] == "base"} == set(PYTHONS)
    # the build form offers the Pythons whose base is in the catalogue and here; the job form the ready ones here
    assert api.client.get("/api/v1/images/options", headers=ana).json()["python"] == ["3.9", "3.11"]
    me = browser_for(api.client, "ana", "password-123")
    form = me.get("/new/jupyter").text
    assert 'value="caldera/default:bookworm"' in form and "caldera/pytorch:bookworm" not in form


def test_only_admins_curate_the_catalogue_and_a_removed_base_is_no_longer_offered(api, admin, ana, here):
    entry = {"ref": "localhost/caldera/vision:2", "kind": "ready", "python": "3.11", "cuda": "12.x",
             "inside": "torchvision, opencv"}  # fmt: skip
    assert api.client.post("/api/v1/images/environments", json=entry, headers=ana).status_code == 403
    r = api.client.post("/api/v1/images/environments", json=entry, headers=admin)
    assert r.status_code == 201 and r.json()["ref"] == "caldera/vision:2" and r.json()["present"] is False, r.text
    assert api.client.post("/api/v1/images/environments", json=entry, headers=admin).status_code == 409
    for ref in ("docker.io/library/python:3.11", "user/ana/x:1", "caldera/../x"):
        r = api.client.post("/api/v1/images/environments", json={**entry, "ref": ref}, headers=admin)
        assert r.status_code == 400 and r.json()["errors"][0]["field"] == "ref", (ref, r.text)
    assert api.client.delete("/api/v1/images/environments/caldera/base:bullseye", headers=ana).status_code == 403
    assert api.client.delete("/api/v1/images/environments/caldera/base:bullseye", headers=admin).status_code == 204
    assert api.client.get("/api/v1/images/options", headers=ana).json()["python"] == ["3.11"]
    r = api.client.post("/api/v1/images", json={**GOOD, "python": "3.9"}, headers=ana)
    assert r.status_code == 400 and r.json()["errors"][0]["code"] == "BaseImageMissing", r.text
    with api.client.app.state.platform.session() as db:
        actions = [(a.action, a.target) for a in db.query(AdminAudit).order_by(AdminAudit.id)]
        added, removed = ("add-environment", "caldera/vision:2"), ("remove-environment", "caldera/base:bullseye")
        assert actions[-2:] == [added, removed]
        assert db.query(Image).count() == 0


@pytest.mark.parametrize(
    "cuda, cudnn, code",
    [("none", "9.1", "CudnnNeedsCuda"), ("12.4", "8.7", "CudnnCudaMismatch"), ("11.8", "9.5", "CudnnCudaMismatch")],
)
def test_a_cudnn_that_cannot_go_with_the_cuda_is_refused_at_the_form_in_the_readers_language(
    api, ana, here, cuda, cudnn, code
):
    r = api.client.post("/api/v1/images", json={**GOOD, "cuda": cuda, "cudnn": cudnn}, headers=ana)
    assert r.status_code == 400 and r.json()["errors"][0]["code"] == code, r.text
    me = browser_for(api.client, "ana", "password-123")
    me.cookies.set(i18n.LANG_COOKIE, "zh")
    page = post_form(me, "/images", {"name": "tools", "python": "3.11", "cuda": cuda, "cudnn": cudnn})
    assert page.status_code == 400
    zh = i18n.translations("zh").gettext
    needs_major = "11" if cudnn.startswith("8") else "12"
    expected = (
        zh("cuDNN %(cudnn)s needs CUDA %(needs)s.x; choose one")
        if cuda == "none"
        else zh("cuDNN %(cudnn)s is built for CUDA %(needs)s.x, not CUDA %(cuda)s")
    ) % {"cudnn": cudnn, "cuda": cuda, "needs": needs_major}
    assert expected in html.unescape(page.text) and "built for" not in page.text and "needs CUDA" not in page.text
    with api.client.app.state.platform.session() as db:
        assert db.query(Image).count() == 0


def test_cuda_and_cudnn_pairs_that_match_are_accepted(api, ana, here):
    for cuda, cudnn in (("11.7", "8.7"), ("11.8", "8.9"), ("12.1", "9.1"), ("12.6", "9.5")):
        r = api.client.post("/api/v1/images", json={**GOOD, "name": f"t{cuda}", "cuda": cuda, "cudnn": cudnn},
                            headers=ana)  # fmt: skip
        assert r.status_code == 202, (cuda, cudnn, r.text)


def _published(requirement: str, python: str) -> bool:
    """Whether PyPI's index (its JSON form, PEP 691) has a Linux x86-64 wheel of ``name==version`` that installs on
    ``python``."""
    name, version = requirement.split("==")
    index = httpx.get(f"https://pypi.org/simple/{name}/", headers={"Accept": SIMPLE_JSON}, timeout=30).json()
    interpreter = f"cp{python.replace('.', '')}"
    for f in index["files"]:
        if not f["filename"].endswith(".whl") or f.get("yanked"):
            continue
        _, wheel_version, _, tags = parse_wheel_filename(f["filename"])
        spec = f.get("requires-python") or ""
        if wheel_version != Version(version) or (spec and Version(python) not in SpecifierSet(spec)):
            continue
        if any(t.platform.endswith("x86_64") and t.interpreter in ("py3", interpreter) for t in tags):
            return True
    return False


def test_every_offered_cuda_and_cudnn_wheel_is_published_for_every_offered_python():
    try:
        httpx.get("https://pypi.org/simple/pip/", headers={"Accept": SIMPLE_JSON}, timeout=20).raise_for_status()
    except httpx.HTTPError as exc:
        needs.missing(f"PyPI is not reachable: {exc}")
    wheels = sorted({w for ws in (*CUDA.values(), *CUDNN.values()) for w in ws})
    missing = [(w, py) for w in wheels for py in PYTHONS if not _published(w, py)]
    assert not missing, missing


def test_every_refusal_of_the_build_form_reads_in_chinese_with_the_value_kept():
    """Each bad field of tests/test_images.py, as the zh images page shows it: Chinese around the user's value."""
    from pydantic import ValidationError

    from caldera.images.form import BuildForm
    from caldera.server.web.reason_text import Say
    from tests.test_images import BAD

    say = Say(i18n.translations("zh").gettext)
    for field, value in BAD:
        with pytest.raises(ValidationError) as err:
            BuildForm.model_validate({**GOOD, field: value})
        for e in err.value.errors():
            shown = say.english_reason(e["msg"])
            words = re.sub(r"'[^']*'|\"[^\"]*\"|\^\S*\$|\S*[=/.*+<>\[\]-]\S*", "", shown)  # values, patterns, names
            assert re.search(r"[\u4e00-\u9fff]", shown) and not re.search(r"[a-z]{3,} [a-z]{3,}", words), (field, shown)
