"""Every route of the OpenAPI document, fuzzed by schemathesis (from PyPI), as a normal user and as an admin: no
input may make the server answer 5xx. Bounded: a couple of dozen examples per operation and role, and for each
operation two more at the limits of their types (issue 21's 500s were an id past 2**63 and a deeply nested
document): every integer of its path, query and body past any database's range, and every body field nested deep."""

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from schemathesis.core import NOT_SET
from schemathesis.generation.hypothesis.examples import generate_one

EXAMPLES = 25
HUGE = 2**64 + 1  # past PostgreSQL's integer and bigint and SQLite's 64 bits
DEEP = 300  # nesting that a client's JSON encoder still writes; the server's limits are tested deeper apart


def _document() -> dict:
    """The OpenAPI document, read off an app that is never started (routes need no platform to be described)."""
    from types import SimpleNamespace

    from caldera.config import Settings
    from caldera.server.app import create_app

    return create_app(SimpleNamespace(settings=Settings()), run_loop=False).openapi()


schema = schemathesis.openapi.from_dict(_document())


def _huge(value: Any) -> Any:
    """Every integer (not a boolean) in ``value`` replaced by one past every database's range."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return HUGE
    if isinstance(value, dict):
        return {k: _huge(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_huge(v) for v in value]
    return value


def _nested(value: Any) -> Any:
    for _ in range(DEEP):
        value = [value] if len(str(value)) % 2 else {"a": value}
    return value


def _deep(body: Any) -> Any:
    """Each field of a body nested DEEP levels down (the body itself, if it is not an object)."""
    return {k: _nested(v) for k, v in body.items()} if isinstance(body, dict) else _nested(body)


@schema.hook
def before_add_examples(context, examples) -> None:
    """Two explicit cases per operation, made from a generated valid one: every integer at HUGE, every body field
    nested deep. Explicit: they run on every run, whatever the fuzzer draws."""
    operation = context.operation
    base = generate_one(operation.as_strategy())
    same = {"media_type": base.media_type, "headers": dict(base.headers or {})}
    examples.append(
        operation.Case(
            path_parameters=_huge(base.path_parameters),
            query=_huge(base.query),
            body=base.body if base.body is NOT_SET else _huge(base.body),
            **same,
        )
    )
    if base.body is not NOT_SET and "json" in (base.media_type or ""):
        examples.append(
            operation.Case(path_parameters=base.path_parameters, query=base.query, body=_deep(base.body), **same)
        )


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    """One server for all operations (a fresh one per operation would cost more than the fuzzing), on PostgreSQL
    when the tests have one: it is the stricter database (NUL bytes, column lengths)."""
    from fastapi.testclient import TestClient

    from caldera.server.app import create_app
    from caldera.server.platform import Platform
    from caldera.server.tenancy import bootstrap
    from tests.conftest import POSTGRES_URL, _fresh_postgres_db, make_settings

    url = _fresh_postgres_db() if POSTGRES_URL else None
    p = Platform.create(make_settings(tmp_path_factory.mktemp("fuzz"), url, access_token_ttl_s=3600))
    with p.session() as db:
        bootstrap(db, "admin-password")
        db.commit()
    with TestClient(create_app(p, run_loop=False), raise_server_exceptions=False) as c:
        yield c  # no loop: submitted jobs stay queued, nothing runs
    p.engine.dispose()


@pytest.fixture(scope="module")
def tokens(client) -> dict[str, dict[str, str]]:
    """Access tokens of the admin and of a normal user, alice: nothing the fuzzer can guess ends them (it revokes
    personal tokens by id, and fails logins until the rate limit answers)."""

    def personal(username: str, password: str) -> dict[str, str]:
        pair = client.post("/api/v1/auth/login", json={"username": username, "password": password}).json()
        return {"Authorization": f"Bearer {pair['access_token']}"}

    admin = personal("admin", "admin-password")
    r = client.post("/api/v1/users", json={"username": "alice", "password": "password-123"}, headers=admin)
    assert r.status_code == 201, r.text
    return {"admin": admin, "user": personal("alice", "password-123")}


FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,  # the same examples on every run: a failure here is reproducible, not a flake
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)


def _call(client, case, headers):
    kw = case.as_transport_kwargs(base_url="http://testserver", headers={**(case.headers or {}), **headers})
    if "data" in kw and isinstance(kw["data"], (bytes, str)):
        kw["content"] = kw.pop("data")
    kw.pop("timeout", None)
    kw.pop("allow_redirects", None)
    kw.pop("verify", None)
    kw.pop("cookies", None)  # no route takes one; the session cookie would only meet the CSRF check
    response = client.request(**kw)
    if response.status_code == 503 and "image registry" in response.text:
        return  # no registry runs for this app: its clear 503 is the right answer (tests/test_images.py)
    if response.status_code == 503 and response.text.startswith("no metrics:"):
        return  # nor a Prometheus: the accounting CSV says so (tests/test_metrics_api.py)
    assert response.status_code < 500, f"{case.method} {case.formatted_path}: {response.status_code} {response.text}"


@schema.parametrize()
@FUZZ
def test_no_route_answers_5xx_to_a_user(case, client, tokens):
    _call(client, case, tokens["user"])


@schema.parametrize()
@FUZZ
def test_no_route_answers_5xx_to_an_admin(case, client, tokens):
    _call(client, case, tokens["admin"])
