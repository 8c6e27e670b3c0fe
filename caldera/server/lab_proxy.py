"""The reverse proxy to interactive jobs (Jupyter Lab, VS Code's code-server), served on the labs' origins only: each
lab on its own, ``CALDERA_LAB_PUBLIC_URL`` with the job's id for ``{job}`` (``http://<job>.lab.localhost:8643`` by
default).

Which lab: the one the request's Host names. A Host that names no existing lab is refused, and so is a path outside
its home (``lab_home``: Lab's base URL, ``/jobs/<job>/lab/``; code-server's the origin's root, as code-server is
not made to live under a prefix), so one lab's page never reaches another lab through its own origin.

Who may pass: the holder of this job's lab cookie (minted by ``lab_app`` from a one-use ticket that the platform's
origin issued after its own login; host-only, so the browser keeps it for this lab's host alone), or an API client
presenting a platform bearer token. The platform's session cookie is never accepted here.

What another page can do is limited by the origin, not by trust in the notebook: another lab of the same site (a
page its owner serves by replacing Lab with a server of their own) may still make the browser send this lab's
cookie, so cookie-authenticated websockets and state-changing requests must come from this lab's own origin, and a
cookie-authenticated request from another origin is answered only when it is the browser's own navigation to a page
here (Fetch Metadata), never when a page embeds or fetches it. Jupyter's own XSRF check stays on, because the proxy
logs in to Lab with Lab's login cookie instead of its token (see runtime/local/jupyter.py); it is no defence
between labs (a sibling host can set this host's ``_xsrf`` cookie). Lab's token and login never reach the browser.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from http.cookies import CookieError, SimpleCookie
from urllib.parse import quote

import httpx
import websockets
from fastapi import APIRouter, HTTPException, Request, WebSocket
from fastapi.responses import RedirectResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.websockets import WebSocketDisconnect

from caldera.config import lab_job_of
from caldera.core.spec import JobKind
from caldera.core.states import JobState
from caldera.db.models import Job, User
from caldera.runtime.base import Endpoint, Handle
from caldera.server import jobs
from caldera.server.deps import user_for_token
from caldera.server.lab_errors import LabRefused
from caldera.server.platform import Platform
from caldera.server.security import LAB_SESSION, TokenError, credentials_current, decode_lab

router = APIRouter(tags=["lab"])

LAB_COOKIE = "caldera_lab"
_SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}
# hop-by-hop headers (RFC 9110 7.6.1), and the browser's credentials and origin, which are for this proxy alone
_DROP_REQUEST = {
    "host",
    "connection",
    "keep-alive",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "authorization",
    "cookie",
    "origin",
    "content-length",
    "accept-encoding",
}  # identity upstream, so HTML can be scrubbed of the lab's token
_DROP_RESPONSE = {"connection", "keep-alive", "transfer-encoding"}
# the servers' own login cookies (Lab's, code-server's): added here, never given to or taken from a browser
_LAB_LOGIN_COOKIES = ("username-", "code-server-session")


@dataclass(frozen=True)
class Caller:
    user_id: int
    cookie_issued_at: float | None = None  # a lab cookie: ambient credentials, so the origin is checked too

    @property
    def by_cookie(self) -> bool:
        return self.cookie_issued_at is not None


def lab_path(job_id: str) -> str:
    return f"/jobs/{job_id}/lab/"


def lab_home(job_id: str, kind: str) -> str:
    """Where a lab lives on its origin: Jupyter under its base URL, code-server at the root."""
    return "/" if kind == JobKind.VSCODE.value else lab_path(job_id)


def host_job(p: Platform, host: str) -> tuple[str, str]:
    """The job whose lab this Host names, and the lab's home; 404 unless it names an existing lab."""
    job_id = lab_job_of(p.settings.lab_url_template, host)
    with p.session() as db:
        job = db.get(Job, job_id) if job_id else None
        if job is None or not JobKind(job.kind).interactive:
            raise LabRefused(404, "NoLab")
        return job.id, lab_home(job.id, job.kind)


def _this_lab(connection: Request | WebSocket) -> str:
    """The Host's job (``lab_app`` put it in the state); a path outside its lab's home, such as another job's lab
    under this host, is no path here."""
    if not connection.url.path.startswith(connection.state.lab_home):
        raise LabRefused(404, "NoSuchPath")
    return connection.state.lab_job


def _lab_cookies(header: str) -> list[str]:
    """Every lab cookie the browser sent: a sibling host may have added one of its own (Domain=<parent>), which
    must not hide this host's."""
    pairs = (part.strip().partition("=") for part in header.split(";"))
    return [value.strip('"') for name, _, value in pairs if name == LAB_COOKIE]


def _caller(p: Platform, job_id: str, authorization: str, cookies: list[str]) -> Caller | None:
    if authorization.lower().startswith("bearer "):
        with p.session() as db:
            return Caller(user_for_token(p, db, authorization[7:].strip()).id)
    for cookie in cookies:
        try:
            claims = decode_lab(p.keys, cookie, LAB_SESSION)
        except TokenError:
            continue
        if claims.job_id == job_id:
            return Caller(claims.user_id, claims.issued_at)
    return None


def _endpoint(p: Platform, job_id: str, caller: Caller) -> Endpoint:
    with p.session() as db:
        user = db.get(User, caller.user_id)
        if not credentials_current(user, caller.cookie_issued_at or float("inf")):
            raise LabRefused(401, "LogInAgain")
        job = jobs.visible(db, user, job_id)
        if job.state != JobState.RUNNING.value or not job.handle:
            raise LabRefused(503, "NotRunning", job=job_id, state=job.state)
        handle, runtime = Handle(job.id, job.attempt, job.handle), p.runtime_of(job.runtime, job.handle)
    eps = [e for e in runtime.endpoints(handle) if e.name == "lab"]
    if not eps:
        raise LabRefused(503, "NoEndpoint")
    return eps[0]


def _origin_ok(p: Platform, job_id: str, origin: str | None, caller: Caller) -> bool:
    """A request that names an origin must come from this lab's own; one that names none only from a script (a
    bearer token: no ambient credentials to abuse)."""
    if origin is None:
        return not caller.by_cookie
    return origin.rstrip("/").lower() == p.settings.lab_url(job_id).lower()


def _fetch_ok(request: Request, caller: Caller) -> bool:
    """A cookie-authenticated request from another origin (Fetch Metadata: browsers send it to https and localhost
    origins) is answered only as the browser's own top-level navigation, never to a page that embeds or fetches."""
    site = request.headers.get("sec-fetch-site")
    if not caller.by_cookie or site in (None, "same-origin", "none"):
        return True
    mode, dest = request.headers.get("sec-fetch-mode"), request.headers.get("sec-fetch-dest")
    return mode == "navigate" and dest == "document" and request.method in ("GET", "HEAD")


def _scrub(body: bytes, ep: Endpoint) -> bytes:
    for secret in ep.secrets:
        if len(secret) >= 16:
            body = body.replace(secret.encode(), b"")
    return body


def _browser_cookies(header: str) -> list[str]:
    """The browser's cookies that belong to Lab (e.g. ``_xsrf``): not ours, not a Lab login it might forge."""
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(header)
    except CookieError:
        return []
    return [f"{k}={m.coded_value}" for k, m in jar.items() if k != LAB_COOKIE and not k.startswith(_LAB_LOGIN_COOKIES)]


def _upstream_headers(headers, ep: Endpoint) -> dict[str, str]:
    out = {k: v for k, v in headers.items() if k.lower() not in _DROP_REQUEST}
    out["cookie"] = "; ".join([*_browser_cookies(headers.get("cookie", "")), ep.headers.get("Cookie", "")]).strip("; ")
    out["host"] = ep.host if ep.socket else f"{ep.host}:{ep.port}"
    # identity, said explicitly: httpx would otherwise offer gzip, and a server that compresses (code-server does)
    # would send a page the proxy cannot scrub, under a Content-Encoding that no longer holds once httpx decoded it
    out["accept-encoding"] = "identity"
    out.update({k: v for k, v in ep.headers.items() if k.lower() != "cookie"})
    return out


def _response_headers(resp: httpx.Response) -> list[tuple[bytes, bytes]]:
    keep = []
    for k, v in resp.headers.multi_items():
        lk = k.lower()
        if lk in _DROP_RESPONSE or (lk == "set-cookie" and v.lstrip().startswith(_LAB_LOGIN_COOKIES)):
            continue
        keep.append((k.encode("latin-1"), v.encode("latin-1")))
    return keep


def _client(request: Request, ep: Endpoint) -> httpx.AsyncClient:
    clients: dict[str, httpx.AsyncClient] = request.app.state.lab_clients
    key = ep.socket or f"{ep.host}:{ep.port}"
    if key not in clients:
        transport = httpx.AsyncHTTPTransport(uds=ep.socket) if ep.socket else None
        clients[key] = httpx.AsyncClient(
            transport=transport, follow_redirects=False, timeout=httpx.Timeout(60.0, connect=10.0)
        )
    return clients[key]


def _to_platform(p: Platform, request: Request, job_id: str) -> RedirectResponse:
    """A browser without a (valid) lab cookie goes back to the platform's way into this lab (``lab_entry``), which
    logs it in and sends it here, to the same place."""
    query = f"?{request.url.query}" if request.url.query else ""
    here = lab_path(job_id) + request.url.path.removeprefix(request.state.lab_home)
    return RedirectResponse(f"{p.settings.url}{quote(here)}{query}", status_code=303)


@router.api_route(
    "/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"], include_in_schema=False
)
async def http_proxy(path: str, request: Request) -> Response:
    p: Platform = request.app.state.platform
    job_id = _this_lab(request)
    cookies = _lab_cookies(request.headers.get("cookie", ""))
    caller = await asyncio.to_thread(_caller, p, job_id, request.headers.get("authorization", ""), cookies)
    if caller is None:
        if request.method == "GET" and "text/html" in request.headers.get("accept", ""):
            return _to_platform(p, request, job_id)
        raise LabRefused(401, "NotAuthenticated")
    if not _fetch_ok(request, caller) or (
        request.method not in _SAFE_METHODS and not _origin_ok(p, job_id, request.headers.get("origin"), caller)
    ):
        raise LabRefused(403, "CrossOrigin")
    ep = await asyncio.to_thread(_endpoint, p, job_id, caller)
    client = _client(request, ep)
    base = "http://localhost" if ep.socket else f"http://{ep.host}:{ep.port}"
    upstream = client.build_request(
        request.method,
        base + request.url.path,
        params=request.query_params,
        headers=_upstream_headers(request.headers, ep),
        content=request.stream(),
    )
    resp = await client.send(upstream, stream=True)
    headers = _response_headers(resp)
    if resp.headers.get("content-type", "").startswith("text/html"):
        # Lab may write its token into the page config; the browser does not need it, so it never leaves here
        body = _scrub(await resp.aread(), ep)
        await resp.aclose()
        page = Response(body, status_code=resp.status_code)
        page.raw_headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
        page.raw_headers.append((b"content-length", str(len(body)).encode()))
        return page
    out = StreamingResponse(resp.aiter_raw(), status_code=resp.status_code, background=BackgroundTask(resp.aclose))
    # aiter_raw passes the body through as sent, so length and encoding headers stay true
    out.raw_headers = headers
    return out


@router.websocket("/{path:path}")
async def ws_proxy(websocket: WebSocket, path: str) -> None:
    p: Platform = websocket.app.state.platform
    try:
        job_id = _this_lab(websocket)
        cookies = _lab_cookies(websocket.headers.get("cookie", ""))
        caller = await asyncio.to_thread(_caller, p, job_id, websocket.headers.get("authorization", ""), cookies)
        if caller is None or not _origin_ok(p, job_id, websocket.headers.get("origin"), caller):
            raise HTTPException(403, "refused")
        ep = await asyncio.to_thread(_endpoint, p, job_id, caller)
    except Exception:  # noqa: BLE001 - any refusal closes with policy violation, telling nothing more
        await websocket.close(code=1008)
        return
    query = f"?{websocket.url.query}" if websocket.url.query else ""
    headers = _upstream_headers(websocket.headers, ep)
    for h in (
        "sec-websocket-key",
        "sec-websocket-version",
        "sec-websocket-extensions",
        "sec-websocket-protocol",
        "host",
    ):
        headers.pop(h, None)
    protocols = [s.strip() for s in websocket.headers.get("sec-websocket-protocol", "").split(",") if s.strip()]
    options = {"additional_headers": headers, "subprotocols": protocols or None, "max_size": None, "open_timeout": 20}
    try:
        if ep.socket:
            upstream = await websockets.unix_connect(ep.socket, f"ws://{ep.host}{websocket.url.path}{query}", **options)
        else:
            upstream = await websockets.connect(f"ws://{ep.host}:{ep.port}{websocket.url.path}{query}", **options)
    except Exception:  # noqa: BLE001
        await websocket.close(code=1011)
        return
    await websocket.accept(subprotocol=upstream.subprotocol)
    await _pump(websocket, upstream)


async def _pump(websocket: WebSocket, upstream) -> None:  # noqa: ANN001 - a websockets client connection
    async def client_to_upstream() -> None:
        try:
            while True:
                msg = await websocket.receive()
                if msg["type"] == "websocket.disconnect":
                    break
                if msg.get("bytes") is not None:
                    await upstream.send(msg["bytes"])
                elif msg.get("text") is not None:
                    await upstream.send(msg["text"])
        except (WebSocketDisconnect, websockets.ConnectionClosed):
            pass
        finally:
            await upstream.close()

    async def upstream_to_client() -> None:
        try:
            async for data in upstream:
                if isinstance(data, bytes):
                    await websocket.send_bytes(data)
                else:
                    await websocket.send_text(data)
        except (WebSocketDisconnect, websockets.ConnectionClosed, RuntimeError):
            pass
        finally:
            try:
                await websocket.close()
            except (RuntimeError, WebSocketDisconnect):  # the browser left first (a closed tab): nothing to tell
                pass

    await asyncio.gather(client_to_upstream(), upstream_to_client())
