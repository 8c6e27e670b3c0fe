"""The platform's own cookies (the session, the CSRF token, the language) carry ``Secure`` when the platform is
served over https (CALDERA_PUBLIC_URL https://...), so a browser never sends them over plain http; and not
otherwise (the control: a plain-http platform would lose its session). Read from the raw Set-Cookie headers."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from caldera.server.csrf import CSRF_COOKIE
from caldera.server.deps import SESSION_COOKIE
from caldera.server.web.i18n import LANG_COOKIE
from tests.conftest import make_settings

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def _attributes(response, name: str) -> set[str]:
    """The attributes of the Set-Cookie that sets ``name`` (lower-case, values dropped)."""
    for line in response.headers.get_list("set-cookie"):
        if line.startswith(name + "="):
            return {part.split("=", 1)[0].strip().lower() for part in line.split(";")[1:]}
    raise AssertionError(f"no Set-Cookie for {name}: {response.headers.get_list('set-cookie')}")


def _cookies_of(tmp_path, db_url, public_url: str) -> dict[str, set[str]]:
    """Log in through the form as a browser would, on a platform whose public URL is ``public_url``."""
    from caldera.server.app import create_app
    from caldera.server.platform import Platform
    from caldera.server.tenancy import bootstrap

    p = Platform.create(make_settings(tmp_path, db_url, public_url=public_url))
    with p.session() as db:
        bootstrap(db, "admin-password")
        db.commit()
    try:
        with TestClient(create_app(p, run_loop=False), base_url=public_url) as browser:
            page = browser.get("/login")
            token = browser.cookies[CSRF_COOKIE]
            login = browser.post(
                "/login",
                data={"username": "admin", "password": "admin-password", "csrf_token": token},
                headers={"Origin": public_url},
                follow_redirects=False,
            )
            assert login.status_code == 303, login.text
            lang = browser.post(
                "/language", data={"lang": "zh", "csrf_token": token}, headers={"Origin": public_url},
                follow_redirects=False,
            )  # fmt: skip
            assert lang.status_code == 303, lang.text
            return {
                CSRF_COOKIE: _attributes(page, CSRF_COOKIE),
                SESSION_COOKIE: _attributes(login, SESSION_COOKIE),
                LANG_COOKIE: _attributes(lang, LANG_COOKIE),
            }
    finally:
        p.engine.dispose()


def test_the_platforms_cookies_are_secure_under_https(tmp_path, db_url):
    cookies = _cookies_of(tmp_path, db_url, "https://caldera.example.edu")
    for name, attrs in cookies.items():
        assert "secure" in attrs, (name, attrs)
    assert {"httponly", "samesite"} <= cookies[SESSION_COOKIE] and {"httponly"} <= cookies[CSRF_COOKIE]


def test_and_not_under_plain_http(tmp_path, db_url):
    cookies = _cookies_of(tmp_path, db_url, "http://127.0.0.1:8642")
    for name, attrs in cookies.items():
        assert "secure" not in attrs, (name, attrs)
    assert "httponly" in cookies[SESSION_COOKIE]
