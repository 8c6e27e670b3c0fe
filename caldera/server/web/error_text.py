"""The API's error reasons in the reader's language. The API speaks English (its reasons are pydantic's messages
and our own); each known shape below maps to a catalogue message with the same values filled in, and a reason of
no known shape is shown as the API said it."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

_ = str  # marks msgids for extraction; the real translation happens in translate()

# (the API's English, as a pattern) -> catalogue message; named groups fill the placeholders
SHAPES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern + r"\Z", re.S), msgid)
    for pattern, msgid in (
        (r"Field required", _("required")),
        (r"String should match pattern '(?P<pattern>.*)'", _("must match the pattern %(pattern)s")),
        (r"String should have at most (?P<n>\d+) characters?", _("at most %(n)s characters")),
        (r"String should have at least (?P<n>\d+) characters?", _("at least %(n)s characters")),
        (r"Input should be greater than or equal to (?P<n>\S+)", _("must be at least %(n)s")),
        (r"Input should be greater than (?P<n>\S+)", _("must be greater than %(n)s")),
        (r"Input should be less than or equal to (?P<n>\S+)", _("must be at most %(n)s")),
        (r"Input should be a valid integer.*", _("must be a whole number")),
        (r"Input should be a valid number.*", _("must be a number")),
        (r"Input should be a valid boolean.*", _("must be true or false")),
        (r"Extra inputs are not permitted", _("is not a known field")),
        (r"Input should be (?P<choices>'[^']*'(?:, '[^']*')*(?: or '[^']*')?)", _("must be one of %(choices)s")),
        (
            r"(?:Value error, )?invalid environment variable name (?P<name>.*): use ASCII letters, digits and _, "
            r"not starting with a digit",
            _("invalid environment variable name %(name)s: use ASCII letters, digits and _, not starting with a digit"),
        ),
        (
            r"(?:Value error, )?the value of (?P<name>\w+) contains a NUL byte, which no environment can hold",
            _("the value of %(name)s contains a NUL byte, which no environment can hold"),
        ),
        (r"you are not a member of account (?P<account>.*)", _("you are not a member of account %(account)s")),
        (r"no node (?P<node>.*)", _("no node %(node)s")),
        (r"you cannot disable yourself", _("you cannot disable yourself")),
        (r"you cannot change your own role", _("you cannot change your own role")),
        (r"wrong current password", _("wrong current password")),
        (r"a public key is at most (?P<n>\d+) characters", _("a public key is at most %(n)s characters")),
        (r"this is a private key; paste the \.pub file", _("this is a private key; paste the .pub file")),
        (
            r"this is an RFC 4716 key; paste the OpenSSH form \(ssh-keygen -i -f FILE prints it\)",
            _("this is an RFC 4716 key; paste the OpenSSH form (ssh-keygen -i -f FILE prints it)"),
        ),
        (r"paste a public key", _("paste a public key")),
        (r"paste one key: this has several lines", _("paste one key: this has several lines")),
        (r"the key contains control characters", _("the key contains control characters")),
        (r"the name contains control characters", _("the name contains control characters")),
        (r"a name is at most (?P<n>\d+) characters", _("a name is at most %(n)s characters")),
        (
            r"options before the key \(from=, command=, \.\.\.\) are not accepted; paste the key alone",
            _("options before the key (from=, command=, ...) are not accepted; paste the key alone"),
        ),
        (r"unknown key type (?P<type>.*); one of (?P<types>.*)", _("unknown key type %(type)s; one of %(types)s")),
        (r"the key's base64 part is missing", _("the key's base64 part is missing")),
        (r"the key's base64 part is not valid base64", _("the key's base64 part is not valid base64")),
        (
            r"the key says (?P<declared>\S+) but its data is a (?P<inner>.*) key",
            _("the key says %(declared)s but its data is a %(inner)s key"),
        ),
        (r"the key's data is not a valid (?P<type>\S+) key", _("the key's data is not a valid %(type)s key")),
        (
            r"RSA keys need at least (?P<n>\d+) bits; this one has (?P<bits>\d+)",
            _("RSA keys need at least %(n)s bits; this one has %(bits)s"),
        ),
        (
            r"RSA keys have at most (?P<n>\d+) bits; this one has (?P<bits>\d+)",
            _("RSA keys have at most %(n)s bits; this one has %(bits)s"),
        ),
        (r"you already added this key, as (?P<name>.*)", _("you already added this key, as %(name)s")),
        (
            r"you have (?P<n>\d+) SSH keys, the most one may keep; delete some first",
            _("you have %(n)s SSH keys, the most one may keep; delete some first"),
        ),
        (
            r"no image (?P<name>.*) in the catalogue; `caldera images list` shows the images you may run",
            _("no image %(name)s in the catalogue; `caldera images list` shows the images you may run"),
        ),
        (
            r"no image (?P<name>.*) among the images you may run; `caldera images list` shows them",
            _("no image %(name)s among the images you may run; `caldera images list` shows them"),
        ),
        (
            r"image (?P<name>.*) is not yours to use \((?P<visibility>[a-z]+)\)",
            _("image %(name)s is not yours to use (%(visibility)s)"),
        ),
        (
            r"(?P<name>.*) names several images you may run \((?P<names>.*)\); name one of them",
            _("%(name)s names several images you may run (%(names)s); name one of them"),
        ),
    )
)


def reason(text: str, gettext: Callable[[str], str]) -> str:
    for pattern, msgid in SHAPES:
        m = pattern.match(text)
        if m:
            return gettext(msgid) % m.groupdict() if m.groupdict() else gettext(msgid)
    return text


def translate(errors: Any, gettext: Callable[[str], str]) -> Any:
    """Errors as the pages hold them: a list of {field, reason} rows, or reasons by field name."""
    if isinstance(errors, dict):
        return {k: [reason(r, gettext) if isinstance(r, str) else r for r in v] for k, v in errors.items()}
    if isinstance(errors, list):
        return [{**e, "reason": reason(e["reason"], gettext)} if isinstance(e, dict) else e for e in errors]
    return errors
