"""Security headers, for the platform's origin and the lab origin (one middleware, two header sets).

A header the application set itself wins (Jupyter, behind the lab proxy, sends its own policy)."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

COMMON = {"X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin"}
# the API's interactive docs load Swagger UI from its CDN and start it with an inline script
DOCS_CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline' https://cdn.jsdelivr.net; "
    "style-src 'self' 'unsafe-inline' https://cdn.jsdelivr.net; img-src 'self' data: https://fastapi.tiangolo.com; "
    "frame-ancestors 'none'; base-uri 'none'; object-src 'none'"
)


def platform_headers(labs: str) -> dict[str, str]:
    """The platform's pages are never framed, run only their own scripts, and post forms only to themselves (or,
    through the login's redirect, to a lab origin's ticket exchange: ``labs`` is their wildcard source)."""
    return {
        **COMMON,
        "X-Frame-Options": "DENY",
        "Content-Security-Policy": (
            "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
            f"frame-ancestors 'none'; base-uri 'none'; object-src 'none'; form-action 'self' {labs}"
        ),
    }


class SecurityHeadersMiddleware:
    def __init__(self, app: ASGIApp, headers: dict[str, str], by_path: dict[str, dict[str, str]] | None = None):
        self.app = app
        self.headers = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        self.by_path = {p: [(k.lower().encode(), v.encode()) for k, v in h.items()] for p, h in (by_path or {}).items()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        extra = self.by_path.get(scope["path"], [])
        wanted = {k: v for k, v in [*self.headers, *extra]}

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {k.lower() for k, _ in message.get("headers", [])}
                message["headers"] = [
                    *message.get("headers", []),
                    *((k, v) for k, v in wanted.items() if k not in present),
                ]
            await send(message)

        await self.app(scope, receive, with_headers)
