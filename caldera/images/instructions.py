"""The build form's expert lines, parsed as the Containerfile instructions they become: an allowlist of
instructions, each in the forms listed here and no other. A builder reads flags (``RUN --mount=...``,
``--network``, ``--security``, ``--device``, ...) before an instruction's arguments; no line may carry one, so a
builder bug behind a flag (CVE-2024-9675: ``RUN --mount=type=cache,id=../..`` mounts a host directory) cannot be
reached from the form. No continuation, heredoc, comment or parser directive either: one line is one instruction."""

from __future__ import annotations

import json
import re
import shlex

MAX_LINE = 500
INSTRUCTIONS = ("RUN", "ENV", "WORKDIR", "LABEL")
_LINE = re.compile(r"^([A-Za-z]+)[ \t]+(\S.*)$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LABEL_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")
_WORKDIR = re.compile(r"^/[A-Za-z0-9._/@+-]{0,255}$")
_HEREDOC = re.compile(r"<<-?[ \t]*[\"']?[A-Za-z_]")
_RESERVED_LABEL = "org.caldera."  # the platform's own labels name the image's reference


def problem(line: str) -> str | None:
    """Why ``line`` is not one allowed instruction, or None when it is."""
    if len(line) > MAX_LINE:
        return f"each line is one line of at most {MAX_LINE} characters"
    if any((ord(c) < 32 and c != "\t") or ord(c) == 127 or c in "\u2028\u2029\x85" for c in line):
        return "a line holds no control characters (no newline: each line is one instruction)"
    m = _LINE.match(line)
    if not m or m.group(1).upper() not in INSTRUCTIONS:
        return f"each line is one {'/'.join(INSTRUCTIONS)} instruction followed by its arguments"
    instruction, args = m.group(1).upper(), m.group(2).rstrip()
    if args.endswith("\\"):
        return "no continuation: a line may not end with \\"
    if args.startswith("-"):
        flag = args.split()[0][:40]
        return f"{instruction} takes no flags ({flag}): --mount, --network, --security, --device and all others refused"
    return _CHECKS[instruction](args)


def _run(args: str) -> str | None:
    if args.startswith("["):
        try:
            argv = json.loads(args)
        except ValueError:
            return 'RUN ["program", "argument", ...] must be a JSON list of strings'
        if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
            return 'RUN ["program", "argument", ...] must be a JSON list of strings'
        return None
    if _HEREDOC.search(args):
        return "RUN takes no heredoc (<<WORD)"
    return None


def _pairs(instruction: str, args: str, key: re.Pattern) -> str | None:
    try:
        words = shlex.split(args)
    except ValueError:
        return f"{instruction} has an unclosed quote"
    if "=" not in words[0]:  # the legacy form: ENV NAME value with spaces
        words = [f"{words[0]}=x"]
    for word in words:
        name, eq, _ = word.partition("=")
        if not eq or not key.match(name):
            return f"{instruction} takes NAME=value pairs; {name[:40]!r} is not a valid name"
        if instruction == "LABEL" and name.startswith(_RESERVED_LABEL):
            return f"labels {_RESERVED_LABEL}* are the platform's"
    return None


def _workdir(args: str) -> str | None:
    if not _WORKDIR.match(args):
        return "WORKDIR takes one absolute path of letters, digits and ._/@+-"
    return None


_CHECKS = {
    "RUN": _run,
    "ENV": lambda args: _pairs("ENV", args, _ENV_NAME),
    "LABEL": lambda args: _pairs("LABEL", args, _LABEL_KEY),
    "WORKDIR": _workdir,
}
