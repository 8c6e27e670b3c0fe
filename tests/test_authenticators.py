"""Login goes through the chain of authenticators on app.state: local accounts by default, and another source (as
an LDAP directory would be) plugs in beside them; its users log in through the same rate-limited route."""

import pytest

from caldera.core.tenancy import Role
from caldera.server import tenancy
from caldera.server.errors import NotFound

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


class Directory:
    """A directory that knows one person: the platform user is made on first login, as an LDAP source would."""

    def authenticate(self, db, username, password):
        if (username, password) != ("ldap-carol", "directory-secret"):
            return None
        try:
            return tenancy.get_user(db, username)
        except NotFound:
            user = tenancy.create_user(db, username, "unused-local-password-0", Role.USER, None)
            db.commit()
            return user


def test_another_source_plugs_in_and_local_logins_still_work(api, admin):
    c = api.client
    assert (
        c.post("/api/v1/auth/login", json={"username": "ldap-carol", "password": "directory-secret"}).status_code == 401
    )
    c.app.state.authenticators.append(Directory())
    r = c.post("/api/v1/auth/login", json={"username": "ldap-carol", "password": "directory-secret"})
    assert r.status_code == 200, r.text
    jobs = c.get("/api/v1/jobs", headers={"Authorization": f"Bearer {r.json()['access_token']}"})
    assert jobs.status_code == 200 and jobs.json() == []  # a real session of the new platform user
    assert c.post("/api/v1/auth/login", json={"username": "ldap-carol", "password": "wrong"}).status_code == 401
    assert c.post("/api/v1/auth/login", json={"username": "admin", "password": "admin-password"}).status_code == 200
