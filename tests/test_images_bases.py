"""The build form's base image from the catalogue (issue 24): the API and the page offer the admins' environments
and the ready form-built images the user may run, and a build names one of them or is refused: another user's
private image is as if it did not exist, whichever way it is named."""

from __future__ import annotations

import pytest

from caldera.db.models import Image, User
from caldera.images import catalogue
from tests.conftest import make_settings
from tests.images_fixtures import registry_port  # noqa: F401 - fixture
from tests.portal import browser_for, post_form

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


@pytest.fixture
def settings(tmp_path, db_url, registry_port):  # noqa: F811
    return make_settings(tmp_path, db_url, **registry_port)


@pytest.fixture
def queued(api, monkeypatch):
    """This host's images as the builder sees them, and the builds queued (none runs)."""
    images = {"caldera/base:bookworm", "caldera/default:bookworm"}
    builds = api.client.app.state.builds
    monkeypatch.setattr(builds.builder, "has", lambda ref: ref in images)
    submitted: list[str] = []
    monkeypatch.setattr(builds, "submit", submitted.append)
    return submitted


def _image(api, owner: str, name: str, visibility: str, source: str, form: dict) -> str:
    with api.client.app.state.platform.session() as db:
        user = db.query(User).filter_by(username=owner).one()
        img = catalogue.new(db, user, catalogue.namespace(user, visibility, None), name, "1", visibility, source, form)
        img.state = "ready"
        db.commit()
        return img.id


def test_a_build_names_a_base_of_the_catalogue_that_it_may_see_and_nothing_else(api, admin, queued):
    ana, _ = api.user(admin, "ana"), api.user(admin, "bob")
    mine = _image(api, "ana", "torch-env", "private", "form", {"python": "3.9", "pip": ["torch"]})
    snap = _image(api, "ana", "session", "private", "snapshot", {"job_id": "x"})
    secret = _image(api, "bob", "secret-env", "private", "form", {"python": "3.11"})
    shared = _image(api, "bob", "shared-env", "public", "form", {"python": "3.11"})
    offered = {b["choice"]: b for b in api.client.get("/api/v1/images/bases", headers=ana).json()}
    assert offered["caldera/base:bookworm"]["present"] and not offered["caldera/base:trixie"]["present"]
    assert offered[mine]["python"] == "3.9" and offered[mine]["kind"] == "image" and shared in offered
    assert secret not in offered and snap not in offered
    with api.client.app.state.platform.session() as db:
        secret_ref = catalogue.reference(api.client.app.state.platform.settings, db.get(Image, secret))
    refused = {
        secret: 404, secret_ref: 404, "user/bob/secret-env:1": 404, snap: 404, "../../etc": 400,
        "caldera/vision:1": 404, "caldera/base:trixie": 400, "docker.io/library/alpine": 404,
    }  # fmt: skip
    for base, status in refused.items():
        r = api.client.post("/api/v1/images", json={"name": "x", "base": base}, headers=ana)
        assert r.status_code == status, (base, r.text)
    assert queued == []
    # the base decides the Python: ana's 3.9 image, whatever the form said; the build's FROM is its reference
    r = api.client.post("/api/v1/images", json={"name": "on-torch", "base": mine, "python": "3.11"}, headers=ana)
    assert r.status_code == 202, r.text
    form = r.json()["form"]
    assert form["python"] == "3.9" and form["base"].endswith("/user/ana/torch-env:1")
    assert api.client.post("/api/v1/images", json={"name": "on-env", "base": "caldera/default:bookworm"},
                           headers=ana).status_code == 202  # fmt: skip
    assert len(queued) == 2


def test_the_page_offers_the_bases_as_cards_and_a_refused_choice_shows_why(api, admin, queued):
    api.user(admin, "ana")
    api.user(admin, "bob")
    secret = _image(api, "bob", "secret-env", "private", "form", {"python": "3.11"})
    page = browser_for(api.client, "ana", "password-123")
    text = page.get("/images").text
    assert 'data-base="caldera/base:bookworm"' in text and 'value="caldera/base:bookworm" checked' in text
    assert 'value="caldera/base:trixie"  disabled' in text and "secret-env" not in text
    r = post_form(page, "/images", {"name": "x", "base": secret})
    assert r.status_code == 400 and "among the images you may build on" in r.text and queued == []
    zh = page.get("/images", headers={"Accept-Language": "zh"}).text
    assert "基础镜像" in zh
    r = post_form(page, "/images", {"name": "y", "base": "caldera/default:bookworm"})
    assert r.status_code == 303 and len(queued) == 1
