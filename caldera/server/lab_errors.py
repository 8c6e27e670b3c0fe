"""Why the labs' server refuses a request, in the reader's language: a browser gets a small page (the lab's origin
has no language cookie, so its Accept-Language decides), a script the English ``detail`` and the ``code``."""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException
from starlette.requests import HTTPConnection
from starlette.responses import HTMLResponse, JSONResponse, Response

_ = str  # marks msgids for extraction (babel.cfg); pages translate them

MESSAGES = {
    "NoLab": _("no lab at this address"),
    "NoSuchPath": _("no such path in this lab"),
    "LogInAgain": _("log in again"),
    "NotRunning": _("job %(job)s is %(state)s, not running yet"),
    "NoEndpoint": _("the job exposes no endpoint yet"),
    "NotAuthenticated": _("not authenticated for this lab"),
    "CrossOrigin": _("cross-origin request refused"),
    "TicketRefused": _("lab ticket refused: %(why)s"),
    "TicketForAnotherLab": _("lab ticket refused: it is for another lab"),
    "TicketForAnotherJob": _("the ticket is for another job"),
    "TicketUsed": _("lab ticket already used"),
    "TicketLogInAgain": _("lab ticket refused: log in again"),
}


class LabRefused(HTTPException):
    def __init__(self, status: int, code: str, **params: Any):
        super().__init__(status, MESSAGES[code] % params)
        self.code, self.params = code, params


def response(conn: HTTPConnection, exc: HTTPException) -> Response:
    code = getattr(exc, "code", "")
    if "text/html" not in conn.headers.get("accept", ""):
        return JSONResponse({"detail": exc.detail, **({"code": code} if code else {})}, status_code=exc.status_code)
    from caldera.server.web import i18n
    from caldera.server.web.reason_text import Say
    from caldera.server.web.render import env

    lang = i18n.by_accept_language(conn.headers.get("accept-language", ""))
    gettext = i18n.translations(lang).gettext
    params = dict(getattr(exc, "params", {}))
    if "state" in params:
        params["state"] = Say(gettext).state(params["state"])
    message = gettext(MESSAGES[code]) % params if code else str(exc.detail)
    html = env.get_template("lab_error.html").render(_=gettext, lang=lang, status=exc.status_code, message=message)
    return HTMLResponse(html, status_code=exc.status_code, headers={"Cache-Control": "no-store"})
