"""Driving the portal's forms from a TestClient as a browser would: the CSRF cookie a page sets goes back in the
form's hidden field."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

CSRF_COOKIE = "caldera_csrf"


def csrf(client: TestClient, path: str = "/login") -> str:
    if CSRF_COOKIE not in client.cookies:
        client.get(path)
    return client.cookies[CSRF_COOKIE]


def post_form(client: TestClient, path: str, data: dict | list, **kw):
    """``data`` is a dict, or (name, value) pairs where a name repeats (rows of a table)."""
    fields: dict[str, list[str]] = {}
    for k, v in data.items() if isinstance(data, dict) else data:
        fields.setdefault(k, []).append(v)
    fields["csrf_token"] = [csrf(client)]
    return client.post(path, data=fields, follow_redirects=False, **kw)


def browser_for(client: TestClient, username: str, password: str) -> TestClient:
    """A second cookie jar on the same app, logged in through the login form."""
    b = TestClient(client.app)
    r = post_form(b, "/login", {"username": username, "password": password})
    assert r.status_code == 303, r.text
    return b


def field_errors(html: str, field: str) -> list[str]:
    return re.findall(rf'<span class="field-err" data-field="{re.escape(field)}">([^<]*)</span>', html)
