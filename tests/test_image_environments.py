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
from caldera.images.form import CUDA, CUDNN, PYTHONS, TORCH, BuildForm
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


TORCH_REFUSALS = [
    ("3.11", "11.8", "none", "TorchNotForCuda",
     "PyPI publishes no torch for CUDA %(cuda)s (choose CUDA 11.7 or 12.x for torch)"),
    ("3.9", "12.6", "9.1", "TorchCudnnMismatch",
     "%(torch)s (CUDA %(cuda)s) brings its own cuDNN, not %(cudnn)s; choose cuDNN %(cudnns)s"),
    ("3.11", "11.7", "8.9", "TorchCudnnMismatch",
     "%(torch)s (CUDA %(cuda)s) brings its own cuDNN, not %(cudnn)s; choose cuDNN %(cudnns)s"),
    ("3.13", "12.1", "none", "TorchNotForPython",
     "%(torch)s (CUDA %(cuda)s) has no wheel for Python %(python)s; choose Python %(pythons)s"),
]  # fmt: skip


@pytest.mark.parametrize("python, cuda, cudnn, code, msgid", TORCH_REFUSALS)
def test_torch_that_pypi_does_not_publish_for_the_choice_is_refused_at_the_form_in_the_readers_language(
    api, ana, here, python, cuda, cudnn, code, msgid
):
    here.add("caldera/base:trixie")
    form = {**GOOD, "python": python, "cuda": cuda, "cudnn": cudnn, "pip": ["numpy", "Torch>=2"]}
    r = api.client.post("/api/v1/images", json=form, headers=ana)
    assert r.status_code == 400, r.text
    error = r.json()["errors"][0]
    assert error["code"] == code, r.text
    me = browser_for(api.client, "ana", "password-123")
    me.cookies.set(i18n.LANG_COOKIE, "zh")
    page = post_form(me, "/images", {"name": "tools", "python": python, "cuda": cuda, "cudnn": cudnn, "pip": "torch"})
    assert page.status_code == 400
    expected = i18n.translations("zh").gettext(msgid) % error["params"]
    assert expected in html.unescape(page.text) and "torch (" not in page.text and "no wheel" not in page.text
    with api.client.app.state.platform.session() as db:
        assert db.query(Image).count() == 0


def test_torch_with_a_cuda_is_held_to_the_releases_built_on_it_and_the_same_form_without_torch_is_accepted(
    api, ana, here
):
    form = BuildForm(name="t", python="3.11", cuda="12.4", cudnn="9.1", pip=["numpy", "torch", "six"])
    assert form.mismatch() is None
    assert form.wheels()[-3:] == ["numpy", "torch>=2.5,<2.7", "six"]
    mine = BuildForm(name="t", python="3.11", cuda="12.4", pip=["torch==2.5.1"])
    assert mine.wheels()[-1] == "torch==2.5.1"
    assert BuildForm(name="t", pip=["torch"]).wheels() == ["torch"]  # no CUDA chosen: PyPI's newest
    r = api.client.post("/api/v1/images", json={**GOOD, "cuda": "11.8", "pip": ["torchvision"]}, headers=ana)
    assert r.status_code == 202, r.text


def _torch_releases() -> dict[str, list[dict]]:
    index = httpx.get("https://pypi.org/simple/torch/", headers={"Accept": SIMPLE_JSON}, timeout=60).json()
    by_version: dict[str, list[dict]] = {}
    for f in index["files"]:
        name = f["filename"]
        if name.endswith(".whl") and "linux" in name and name.endswith("x86_64.whl") and not f.get("yanked"):
            by_version.setdefault(str(parse_wheel_filename(name)[1]), []).append(f)
    return by_version


def test_every_torch_the_form_allows_is_published_on_the_cuda_and_cudnn_it_pins_and_only_for_its_pythons():
    """The TORCH table against PyPI: each range has wheels for exactly the offered Pythons it names, and every
    release in it pins the form's CUDA runtime and one of the cuDNNs the table allows."""
    try:
        releases = _torch_releases()
    except httpx.HTTPError as exc:
        needs.missing(f"PyPI is not reachable: {exc}")
    for cuda, torch in TORCH.items():
        if torch is None:
            continue
        spec, pythons, cudnns = torch
        in_range = {v: fs for v, fs in releases.items() if Version(v) in SpecifierSet(spec.removeprefix("torch"))}
        assert in_range, spec
        for py in PYTHONS:
            has = any(f"-cp{py.replace('.', '')}-" in f["filename"] for fs in in_range.values() for f in fs)
            assert has == (py in pythons), (spec, py)
        runtime = next(w for w in CUDA[cuda] if w.startswith("nvidia-cuda-runtime"))
        cudnn_pins: set[str] = set()
        for version, files in in_range.items():
            metadata = httpx.get(files[0]["url"] + ".metadata", timeout=60).text
            pins = {line.split(":", 1)[1].split(";")[0].translate(str.maketrans("", "", " ()"))
                    for line in metadata.splitlines() if line.startswith("Requires-Dist: nvidia-")}  # fmt: skip
            if pins:  # 1.13.1's metadata names its CUDA wheels in no Requires-Dist: it pins nothing
                assert runtime in pins, (version, pins)
                cudnn_pins |= {p for p in pins if p.startswith("nvidia-cudnn")}
        # a cuDNN the form offers for this CUDA is allowed with torch exactly when a release in the range pins it
        for cudnn, wheels in CUDNN.items():
            if cudnn != "none" and wheels[0].endswith(f"-cu{cuda.split('.')[0]}=={wheels[0].rpartition('==')[2]}"):
                assert (wheels[0] in cudnn_pins) == (cudnn in cudnns), (spec, cudnn, cudnn_pins)
        assert "none" in cudnns


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
