"""Form text to the JSON values the API takes: it accepts no strings for numbers (so that ``true`` or ``"2"`` are
never read as counts), while a browser sends nothing but strings."""

from __future__ import annotations

import math


def number(text: str) -> int | float | str:
    """Digits become an int, a decimal a float; anything else is passed on as typed, so the API's own error for
    the field is what the user sees."""
    text = text.strip()
    if text.isascii() and text.isdigit():
        return int(text)
    try:
        value = float(text)
    except ValueError:
        return text
    return value if math.isfinite(value) and text.isascii() else text
