"""Finding 6 of issue 21: the per-address login limit against a real `caldera up` (uvicorn, as deployed). uvicorn
believes X-Forwarded-For from 127.0.0.1 by default, and every local process (each job of the process runtime)
connects from there: rotating the header was a fresh address per try. Now only the proxies of
CALDERA_TRUSTED_PROXIES are believed (none by default). A second loopback address (127.0.0.2) plays the proxy."""

import secrets

import httpx
import pytest

from tests.conftest import ServerProcess, free_port, kill_job_processes, server_env, traversable

LIMIT = 3  # failed logins per address and window


@pytest.fixture
def serve(tmp_path, db_url):
    started = []

    def start(**env: str) -> ServerProcess:
        extra = {"CALDERA_LOGIN_MAX_FAILURES_PER_ADDRESS": str(LIMIT), **env}
        srv = ServerProcess(traversable(tmp_path) / "data", free_port(), {**server_env(tmp_path, db_url), **extra})
        started.append(srv.start())
        return srv

    yield start
    for srv in started:
        srv.stop()
        kill_job_processes(srv.data_dir)


def _client(source: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=30)


def _login(client: httpx.Client, srv: ServerProcess, forwarded: str | None = None) -> int:
    """A failed login under a new name each time (the per-name limit stays out of it): 401, or 429 when limited."""
    headers = {"X-Forwarded-For": forwarded} if forwarded else {}
    body = {"username": "nobody-" + secrets.token_hex(4), "password": "wrong"}
    return client.post(srv.url + "/api/v1/auth/login", json=body, headers=headers).status_code


def _rotating() -> str:
    return f"203.0.113.{secrets.randbelow(250) + 1}"


def test_with_no_trusted_proxy_x_forwarded_for_from_loopback_is_ignored(serve):
    srv = serve()
    with _client("127.0.0.1") as local:
        assert [_login(local, srv, _rotating()) for _ in range(LIMIT)] == [401] * LIMIT
        assert _login(local, srv, _rotating()) == 429  # a new header is not a new address
        assert _login(local, srv) == 429
    with _client("127.0.0.2") as other:
        assert _login(other, srv) == 401  # the control: the limit is per address, another one may still try


def test_a_configured_proxys_header_names_the_client_and_no_one_elses_does(serve):
    srv = serve(CALDERA_TRUSTED_PROXIES="127.0.0.2")
    with _client("127.0.0.2") as proxy:
        assert [_login(proxy, srv, "198.51.100.7") for _ in range(LIMIT)] == [401] * LIMIT
        assert _login(proxy, srv, "198.51.100.7") == 429
        # what the client wrote itself comes first; the proxy appends the address it saw, and that one counts
        assert _login(proxy, srv, f"{_rotating()}, 198.51.100.7") == 429
        assert _login(proxy, srv, "198.51.100.8") == 401  # honoured: another client behind the proxy
    with _client("127.0.0.1") as local:  # not a configured proxy: its header is ignored, as with none
        assert [_login(local, srv, _rotating()) for _ in range(LIMIT)] == [401] * LIMIT
        assert _login(local, srv, _rotating()) == 429


def test_trusted_proxies_are_addresses_or_networks():
    from pydantic import ValidationError

    from caldera.config import Settings

    assert Settings().trusted_proxies == []
    assert Settings(trusted_proxies="10.0.0.1, 10.1.0.0/16 ::1").trusted_proxies == [
        "10.0.0.1/32",
        "10.1.0.0/16",
        "::1/128",
    ]
    for bad in ("*", "proxy.example.edu", "10.0.0.0/33"):
        with pytest.raises(ValidationError):
            Settings(trusted_proxies=bad)
