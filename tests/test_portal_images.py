"""The images page through the real app: my images and the quota, the build form with the base images of the
catalogue that exist here, and the API's errors shown on the form with nothing recorded."""

import html
import re

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
    for v in ("3.11", "3.13"):  # the base cards: one to choose where the base image is on this host
        card = re.search(rf'<input type="radio" name="base"[^>]*value="{builder.base_for(v)}"[^>]*>', page.text)
        assert card and ("disabled" not in card[0]) == builder.has(builder.base_for(v)), v
    assert "镜像" in ana.get("/images", headers={"Accept-Language": "zh"}).text


def test_the_forms_errors_are_the_apis_and_nothing_is_recorded(api, admin):
    api.user(admin, "ana")
    ana = browser_for(api.client, "ana", "password-123")
    typed = {"name": "Bad Name!", "pip": "numpy", "vscode": "true", "extra_lines": "COPY /etc/shadow /x"}
    r = post_form(ana, "/images", typed)
    assert r.status_code == 400
    text = html.unescape(r.text)
    assert "name" in text and "extra_lines" in text and 'value="numpy"' in r.text  # what was typed stays
    assert re.search(r'id="image-vscode" name="vscode" value="true" checked', r.text)
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


def test_my_running_and_failed_builds_have_their_logs_on_the_page_and_no_one_elses(api, admin):
    """The page follows the logs of my builds that run or failed (log_follow.js reads the API's log endpoint,
    tested in test_images_log and in the browser); a ready image keeps a link to its log; bob sees none of ana's."""
    from caldera.db.models import User
    from caldera.images import catalogue

    api.user(admin, "ana")
    api.user(admin, "bob")
    ids = {}
    with api.client.app.state.platform.session() as db:
        ana = db.query(User).filter_by(username="ana").one()
        for state in ("building", "failed", "ready"):
            img = catalogue.new(db, ana, "public", f"env-{state}", "1", "public", "form", {})
            img.state = state
            ids[state] = img.id
        db.commit()
    page = browser_for(api.client, "ana", "password-123").get("/images").text
    for state in ("building", "failed"):
        assert f'data-stream="/api/v1/images/{ids[state]}/stream"' in page, state
    assert f'data-stream="/api/v1/images/{ids["ready"]}/stream"' not in page
    assert f'href="/api/v1/images/{ids["ready"]}/log"' in page and 'src="/static/log_follow.js"' in page
    assert f'<details class="build" id="build-{ids["building"]}" open>' in page
    bob_page = browser_for(api.client, "bob", "password-123").get("/images").text
    assert "env-ready" in bob_page and not any(f"/api/v1/images/{i}/log" in bob_page for i in ids.values())


def _ready_image(api, owner: str, name: str, visibility: str = "private", form: dict | None = None) -> str:
    from caldera.db.models import User
    from caldera.images import catalogue

    p = api.client.app.state.platform
    with p.session() as db:
        who = db.query(User).filter_by(username=owner).one()
        ns = catalogue.namespace(who, visibility, None)
        img = catalogue.new(db, who, ns, name, "1", visibility, "form", form or {})
        img.state = "ready"
        db.commit()
        return catalogue.reference(p.settings, img)


def test_an_image_opens_the_new_job_form_with_it_chosen_and_the_job_runs_in_it(api, admin):
    from urllib.parse import quote

    from tests.portal import field_errors

    ana_api = api.user(admin, "ana")
    api.user(admin, "bob")
    lab = _ready_image(api, "ana", "lab", form={"jupyter": True})
    plain = _ready_image(api, "ana", "plain")
    ide = _ready_image(api, "ana", "ide", form={"vscode": True})
    ana = browser_for(api.client, "ana", "password-123")
    page = ana.get("/images").text
    assert f'href="/new/jupyter?image={quote(lab)}"' in page  # a session only where Jupyter is in it
    assert f'href="/new/jupyter?image={quote(plain)}"' not in page
    assert f'href="/new/vscode?image={quote(ide)}"' in page  # VS Code where code-server is in it
    assert f'href="/new/vscode?image={quote(plain)}"' not in page
    assert f'href="/new/batch?image={quote(plain)}"' in page
    form = ana.get(f"/new/jupyter?image={quote(lab, safe='')}").text
    assert f'<option value="{lab}" selected>' in form and f'<option value="{plain}" >' in form
    r = post_form(ana, "/new/jupyter", {"name": "nb", "queue": "default", "image": lab})
    assert r.status_code == 303, r.text
    jid = r.headers["location"].rsplit("/", 1)[1]
    assert api.client.get(f"/api/v1/jobs/{jid}", headers=ana_api).json()["spec"]["image"] == lab
    # the clone of that job keeps its image
    assert f'<option value="{lab}" selected>' in ana.get(f"/new/jupyter?clone={jid}").text
    # bob is not offered ana's private images, and naming one is the API's refusal on the form
    bob = browser_for(api.client, "bob", "password-123")
    assert lab not in bob.get("/new/jupyter").text
    r = post_form(bob, "/new/jupyter", {"name": "nb", "queue": "default", "image": lab})
    assert r.status_code == 400 and "is not yours to use" in html.unescape(" ".join(field_errors(r.text, ""))), r.text


def test_save_as_image_on_the_job_page_shows_the_apis_refusal_and_records_nothing(api, admin):
    """The snapshot itself (a running session in a container) is tested in test_images_snapshot through this form."""
    ana_api = api.user(admin, "ana")
    api.user(admin, "bob")
    jid = api.client.post("/api/v1/jobs", json={"name": "b", "command": "true"}, headers=ana_api).json()["id"]
    ana = browser_for(api.client, "ana", "password-123")
    assert 'id="save-image"' not in ana.get(f"/jobs/{jid}").text  # only a running session offers it
    r = post_form(ana, f"/jobs/{jid}/snapshot", {"name": "lab"})
    assert r.status_code == 400 and "only a running interactive session can be saved" in r.text, r.text
    r = post_form(ana, f"/jobs/{jid}/snapshot", {"name": "Bad Name!"})
    assert r.status_code == 400 and "<code>name</code>: must match the pattern" in r.text, r.text
    assert ana.post(f"/jobs/{jid}/snapshot", data={"name": "lab"}, follow_redirects=False).status_code == 403
    bob = browser_for(api.client, "bob", "password-123")
    assert post_form(bob, f"/jobs/{jid}/snapshot", {"name": "lab"}).status_code == 404
    assert _count(api) == 0
