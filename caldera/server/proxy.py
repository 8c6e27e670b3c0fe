"""Reverse proxy to interactive jobs (Jupyter Lab) behind the platform's own login.

The browser only ever talks to Caldera; the job's token is added here and never reaches the user. The upstream sees
Host 127.0.0.1:<port> and no Origin, so Jupyter's cross-origin checks pass without being switched off.
"""
from __future__ import annotations

import asyncio
from urllib.parse import quote

import httpx
import websockets
from fastapi import APIRouter, HTTPException, Request, WebSocket
from fastapi.responses import RedirectResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.websockets import WebSocketDisconnect

from caldera.core.states import JobState
from caldera.runtime.base import Endpoint, Handle
from caldera.server import jobs
from caldera.server.deps import SESSION_COOKIE, presented_token, user_for_token
from caldera.server.platform import Platform

router = APIRouter(tags=["proxy"])

# hop-by-hop headers (RFC 9110 7.6.1) and the ones that carry the *platform's* credentials or origin
_DROP_REQUEST = {"host", "connection", "keep-alive", "proxy-authorization", "te", "trailer", "transfer-encoding",
                 "upgrade", "authorization", "cookie", "origin", "content-length",
                 "accept-encoding"}   # identity upstream, so HTML can be scrubbed of the job's token
_DROP_RESPONSE = {"connection", "keep-alive", "transfer-encoding"}


class _NoEndpoint(Exception):
    pass


def _endpoint(p: Platform, token: str | None, job_id: str) -> Endpoint:
    if not token:
        raise HTTPException(401, "not authenticated")
    with p.session() as db:
        user = user_for_token(p, db, token)
        job = jobs.visible(db, user, job_id)
        if job.state != JobState.RUNNING.value or not job.handle:
            raise HTTPException(503, f"job {job_id} is {job.state}, not running yet")
        handle = Handle(job.id, job.attempt, job.handle)
    eps = [e for e in p.runtime.endpoints(handle) if e.name == "lab"]
    if not eps:
        raise HTTPException(503, "the job exposes no endpoint yet")
    return eps[0]


def _scrub(body: bytes, ep: Endpoint) -> bytes:
    for value in ep.headers.values():
        secret = value.split()[-1].encode()
        if len(secret) >= 16:
            body = body.replace(secret, b"")
    return body


def _upstream_headers(headers, ep: Endpoint) -> dict[str, str]:
    out = {k: v for k, v in headers.items() if k.lower() not in _DROP_REQUEST}
    # the platform session cookie stays here; Jupyter's own cookies (e.g. _xsrf) pass through
    cookies = [c for c in headers.get("cookie", "").split(";") if c.strip() and
               not c.strip().startswith(SESSION_COOKIE + "=")]
    if cookies:
        out["cookie"] = ";".join(cookies)
    out["host"] = f"{ep.host}:{ep.port}"
    out.update(ep.headers)
    return out


@router.api_route("/jobs/{job_id}/lab/{path:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD",
                                                            "OPTIONS"], include_in_schema=False)
async def http_proxy(job_id: str, path: str, request: Request) -> Response:
    p: Platform = request.app.state.platform
    token = presented_token(request)
    if not token and request.method == "GET" and "text/html" in request.headers.get("accept", ""):
        return RedirectResponse(f"/login?next={quote(str(request.url.path))}", status_code=303)
    ep = await asyncio.to_thread(_endpoint, p, token, job_id)
    client: httpx.AsyncClient = request.app.state.proxy_client
    url = f"http://{ep.host}:{ep.port}{request.url.path}"
    upstream = client.build_request(request.method, url, params=request.query_params,
                                    headers=_upstream_headers(request.headers, ep), content=request.stream())
    resp = await client.send(upstream, stream=True)
    headers = [(k, v) for k, v in resp.headers.multi_items() if k.lower() not in _DROP_RESPONSE]
    if resp.headers.get("content-type", "").startswith("text/html"):
        # Lab writes its token into the page config; the browser does not need it (this proxy authenticates
        # every request), so it never leaves the platform
        body = _scrub(await resp.aread(), ep)
        await resp.aclose()
        headers = [(k, v) for k, v in headers if k.lower() != "content-length"]
        headers.append(("content-length", str(len(body))))
        page = Response(body, status_code=resp.status_code)
        page.raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]
        return page
    out = StreamingResponse(resp.aiter_raw(), status_code=resp.status_code, background=BackgroundTask(resp.aclose))
    # aiter_raw passes the body through as sent, so length and encoding headers stay true
    out.raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]
    return out


@router.websocket("/jobs/{job_id}/lab/{path:path}")
async def ws_proxy(websocket: WebSocket, job_id: str, path: str) -> None:
    p: Platform = websocket.app.state.platform
    auth = websocket.headers.get("authorization", "")
    token = auth[7:].strip() if auth.lower().startswith("bearer ") else websocket.cookies.get(SESSION_COOKIE)
    try:
        ep = await asyncio.to_thread(_endpoint, p, token, job_id)
    except Exception:  # noqa: BLE001 - any refusal closes with policy violation, telling nothing more
        await websocket.close(code=1008)
        return
    query = f"?{websocket.url.query}" if websocket.url.query else ""
    url = f"ws://{ep.host}:{ep.port}{websocket.url.path}{query}"
    headers = _upstream_headers(websocket.headers, ep)
    for h in ("sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions", "sec-websocket-protocol",
              "host"):
        headers.pop(h, None)
    protocols = [s.strip() for s in websocket.headers.get("sec-websocket-protocol", "").split(",") if s.strip()]
    try:
        upstream = await websockets.connect(url, additional_headers=headers, subprotocols=protocols or None,
                                            max_size=None, open_timeout=20)
    except Exception:  # noqa: BLE001
        await websocket.close(code=1011)
        return
    await websocket.accept(subprotocol=upstream.subprotocol)

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
            except RuntimeError:
                pass

    await asyncio.gather(client_to_upstream(), upstream_to_client())
