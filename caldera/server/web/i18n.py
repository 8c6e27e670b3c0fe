"""Languages of the portal: English (the source strings) and Chinese, from gettext catalogues read at start-up.

The .po files are compiled in memory with Babel, so there is no build step and no .mo file to forget."""

from __future__ import annotations

import io
from functools import cache
from pathlib import Path

from babel.messages.mofile import write_mo
from babel.messages.pofile import read_po
from babel.support import NullTranslations, Translations
from fastapi import Request

LANGUAGES = {"en": "English", "zh": "中文"}
DEFAULT = "en"
LANG_COOKIE = "caldera_lang"
CATALOGUES = Path(__file__).parent / "translations"


def po_path(lang: str) -> Path:
    return CATALOGUES / lang / "LC_MESSAGES" / "messages.po"


@cache
def translations(lang: str) -> NullTranslations:
    path = po_path(lang)
    if not path.exists():
        return NullTranslations()
    with open(path, "rb") as fh:
        catalog = read_po(fh, locale=lang)
    buf = io.BytesIO()
    write_mo(buf, catalog)
    buf.seek(0)
    return Translations(buf)


def _from_accept_language(header: str) -> str | None:
    """The best of our languages in an Accept-Language header ("zh-CN,zh;q=0.9,en;q=0.8")."""
    ranked = []
    for i, item in enumerate(header.split(",")[:20]):
        tag, _, params = item.strip().partition(";")
        q = 1.0
        if params.strip().startswith("q="):
            try:
                q = float(params.strip()[2:])
            except ValueError:
                q = 0.0
        ranked.append((-q, i, tag.strip().lower().split("-")[0]))
    for _, _, lang in sorted(ranked):
        if lang in LANGUAGES:
            return lang
    return None


def by_accept_language(header: str) -> str:
    """The browser's preference alone (an origin that keeps no language cookie: a lab's)."""
    return _from_accept_language(header[:512]) or DEFAULT


def choose(request: Request) -> str:
    """The remembered choice first, then the browser's preference."""
    cookie = request.cookies.get(LANG_COOKIE, "")
    if cookie in LANGUAGES:
        return cookie
    return by_accept_language(request.headers.get("accept-language", ""))
