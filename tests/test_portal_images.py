"""The images page through the real app: my images and the quota, the build form with the Python versions whose
base exists, and the API's errors shown on the form with nothing recorded."""

import html

import pytest

from caldera.db.models import Image
from tests.conftest import make_settings
from tests.images_fixtures import registry_port  # noqa: F401 - fixture
from tests.portal import browser_for, post_form

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


@pytest.fixture
def settings(tmp_path, db_url, registry_port):  # noqa: F811
    return make_settings(tmp_path, db_url, registry_port=registry_port["registry_port"],
                         registry_credentials=registry_port["registry_credentials"])  # fmt: skip


def _count(api) -> int:
    with api.client.app.state.platform.session() as db:
        return db.query(Image).count()


def test_the_page_lists_the_quota_and_offers_the_pythons_whose_base_exists(api, admin):
    api.user(admin, "ana")
    ana = browser_for(api.client, "ana", "password-123")
    page = ana.get("/images")
    assert page.status_code == 200 and 'href="/images"' in page.text
    assert "Quota used: 0 of" in page.text and "No images yet." in page.text
    builder = api.client.app.state.builds.builder
    for v in ("3.11", "3.13"):
        assert (f'<option value="{v}"' in page.text) == builder.has(builder.base_for(v)), v
    assert "镜像" in ana.get("/images", headers={"Accept-Language": "zh"}).text


def test_the_forms_errors_are_the_apis_and_nothing_is_recorded(api, admin):
    api.user(admin, "ana")
    ana = browser_for(api.client, "ana", "password-123")
    r = post_form(ana, "/images", {"name": "Bad Name!", "pip": "numpy", "extra_lines": "COPY /etc/shadow /x"})
    assert r.status_code == 400
    text = html.unescape(r.text)
    assert "name" in text and "extra_lines" in text and 'value="numpy"' in r.text  # what was typed stays
    builder = api.client.app.state.builds.builder
    missing = next((v for v in ("3.13", "3.11") if not builder.has(builder.base_for(v))), None)
    if missing:
        r = post_form(ana, "/images", {"name": "env", "python": missing})
        assert r.status_code == 400 and "caldera images bootstrap --suite" in html.unescape(r.text)
    no_token = ana.post("/images", data={"name": "env"}, follow_redirects=False)
    assert no_token.status_code == 403, no_token.text  # the form's CSRF token is required
    assert _count(api) == 0


def test_another_users_private_image_is_not_on_my_page(api, admin):
    """What bob's page lists is what the API lets him run: ana's public image, not her private one."""
    from caldera.db.models import User
    from caldera.images import catalogue

    api.user(admin, "ana")
    api.user(admin, "bob")
    with api.client.app.state.platform.session() as db:
        ana = db.query(User).filter_by(username="ana").one()
        for visibility, name in (("private", "secret-env"), ("public", "shared-env")):
            img = catalogue.new(db, ana, catalogue.namespace(ana, visibility, None), name, "1", visibility, "form", {})
            img.state = "ready"
        db.commit()
    bob = browser_for(api.client, "bob", "password-123")
    page = bob.get("/images").text
    assert "shared-env" in page and "secret-env" not in page
    assert "secret-env" in browser_for(api.client, "ana", "password-123").get("/images").text
