"""What a dataset's or model's name, version, framework and readers may be: one allowlist for the catalogue
(caldera/storage/catalogue.py), its API and the job spec's ``mounts`` and ``publish``. Unanchored: a caller
anchors it (``fullmatch``, or ``anchored`` for a pydantic pattern, which is searched for anywhere in the value)."""

from __future__ import annotations

NAME = r"[a-z0-9][a-z0-9._-]{0,63}"
VERSION = r"[A-Za-z0-9][A-Za-z0-9._-]{0,31}"
REF = rf"{NAME}(@{VERSION})?"  # name or name@version
SHARE = r"(user|account):[A-Za-z0-9][A-Za-z0-9._-]{0,63}"  # whom a shared entry is shown to
FRAMEWORK = r"[A-Za-z0-9._ +-]*"  # models: pytorch, jax...
VISIBILITY = r"(private|shared|public)"
MAX_DESCRIPTION_CHARS = 4000
MAX_SHARES = 256


def anchored(pattern: str) -> str:
    return f"^{pattern}$"
