"""The HTTP client the CLI uses, and where it keeps its credentials."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx


class ApiError(Exception):
    def __init__(self, status: int, detail: str, errors: list[dict] | None = None):
        super().__init__(detail)
        self.status, self.detail, self.errors = status, detail, errors or []


def config_path() -> Path:
    base = os.environ.get("CALDERA_CONFIG_DIR") or os.path.join(
        os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config"), "caldera"
    )
    return Path(base) / "credentials.json"


def load_credentials() -> dict[str, str]:
    creds: dict[str, str] = {}
    path = config_path()
    if path.exists():
        creds = json.loads(path.read_text())
    if os.environ.get("CALDERA_URL"):
        creds["url"] = os.environ["CALDERA_URL"]
    if os.environ.get("CALDERA_TOKEN"):
        creds["token"] = os.environ["CALDERA_TOKEN"]
    return creds


def save_credentials(url: str, token: str, username: str) -> Path:
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # a token is a password
    with os.fdopen(fd, "w") as fh:
        json.dump({"url": url, "token": token, "username": username}, fh)
    os.replace(tmp, path)
    return path


class Client:
    def __init__(self, url: str, token: str | None = None, timeout: float = 30.0):
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    @classmethod
    def from_config(cls) -> Client:
        creds = load_credentials()
        if not creds.get("url") or not creds.get("token"):
            raise ApiError(401, "not logged in: run `caldera login` first")
        return cls(creds["url"], creds["token"])

    def _check(self, resp: httpx.Response) -> Any:
        if resp.status_code >= 400:
            try:
                body = resp.json()
                raise ApiError(resp.status_code, str(body.get("detail", resp.text)), body.get("errors"))
            except (ValueError, AttributeError):
                raise ApiError(resp.status_code, resp.text) from None
        return resp.json() if resp.content else None

    def get(self, path: str, **params: Any) -> Any:
        return self._check(self.http.get(f"/api/v1{path}", params={k: v for k, v in params.items() if v is not None}))

    def post(self, path: str, body: Any = None) -> Any:
        return self._check(self.http.post(f"/api/v1{path}", json=body))

    def put(self, path: str, body: Any) -> Any:
        return self._check(self.http.put(f"/api/v1{path}", json=body))

    def delete(self, path: str) -> Any:
        return self._check(self.http.delete(f"/api/v1{path}"))

    def stream_logs(self, job_id: str, rank: int | None, follow: bool) -> Iterator[bytes]:
        params: dict[str, Any] = {"follow": str(follow).lower()}
        if rank is not None:
            params["rank"] = rank
        with self.http.stream("GET", f"/api/v1/jobs/{job_id}/logs", params=params, timeout=None) as resp:
            if resp.status_code >= 400:
                resp.read()
                self._check(resp)
            yield from resp.iter_raw()
