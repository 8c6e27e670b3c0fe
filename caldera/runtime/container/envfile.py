"""How a rank's environment reaches its container: only as data, through files root owns, never through the
environment or the options of podman, conmon or the OCI runtime, which run as root and whose loader and Go
runtime read their own environment (``LD_PRELOAD``, ``GODEBUG``...).

Values podman's ``--env-file`` holds go there (a root-only file in the run directory). The others (a newline or a
carriage return, which the file's line format cannot carry, or a line over the 64 KiB podman reads) go into a
second file, mounted read-only into the container at ``MOUNT``, that a fixed launcher applies with the image's
``/bin/sh`` as the job's own uid before it ``exec``s the job's command. Each value is written there octal-escaped
(``printf %b``), so every byte reaches the job as it was sent and no value is ever read as code."""

from __future__ import annotations

import os

from caldera.runtime.local.rundir import RunDir, write_text_atomic

MOUNT = "/.caldera-env"  # in the container: the launcher and its values, read-only
SHELL = "/bin/sh"
_ENV_FILE_MAX_LINE = 60_000  # podman reads its env file line by line with a 64 KiB buffer
_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./,:@+-")
# what a POSIX shell sets for itself at start (dash: PWD, PPID, OPTIND, IFS): when the launcher runs, the job's
# own values for these are applied after the shell started, so the job still gets them
_SHELL_VARS = frozenset({"IFS", "PWD", "OLDPWD", "PPID", "OPTIND", "SHLVL", "_", "PS1", "PS2", "PS4", "ENV"})

# Run as the job's uid inside the container: ``values`` holds one ``NAME vESCAPED`` pair per line, NAME an
# identifier (core.spec checks it) and ESCAPED only the characters of _SAFE and backslashes (after a v, so that an
# empty value is a word too), so the one unquoted expansion splits exactly into those words, on the IFS set here
# (a job's own IFS is among the values whenever the launcher runs). Functions keep their own positional
# parameters, so the job's command ("$@") is untouched and no shell variable of the launcher's own can collide
# with a job's name; the trailing x keeps the newlines command substitution would strip. `command export` does
# not end the shell where a shell keeps the name read-only (bash's PPID).
LAUNCHER = r"""# caldera: applies the job's environment values its env file cannot hold, then runs the job
set -f
IFS='
 '
caldera_set() {
    set -- "$1" "$(printf '%bx' "${2#v}")"
    command export "$1=${2%x}" 2>/dev/null
}
caldera_each() {
    while [ "$#" -ge 2 ]; do
        caldera_set "$1" "$2"
        shift 2
    done
}
caldera_each $(cat "${0%/*}/values")
unset -f caldera_set caldera_each
set +f
exec "$@"
"""


def _escape(value: str) -> str:
    return "v" + "".join(chr(b) if b in _SAFE else f"\\0{b:03o}" for b in value.encode())


def _fits_env_file(name: str, value: str) -> bool:
    return "\n" not in value and "\r" not in value and len(name) + len(value.encode()) < _ENV_FILE_MAX_LINE


def write(rd: RunDir, rank: int, env: dict[str, str]) -> tuple[list[str], list[str]]:
    """Writes rank ``rank``'s environment into its run directory; returns the podman options that hand it over
    (file paths only) and the launcher to put before the job's command (empty when the env file holds it all)."""
    plain = {k: v for k, v in env.items() if _fits_env_file(k, v)}
    rest = {k: v for k, v in env.items() if k not in plain}
    if rest:
        rest |= {k: v for k, v in plain.items() if k in _SHELL_VARS}
        plain = {k: v for k, v in plain.items() if k not in _SHELL_VARS}
    env_file = rd.path / f"rank-{rank}.env"
    write_text_atomic(env_file, "".join(f"{k}={v}\n" for k, v in plain.items()), mode=0o600)
    args = ["--env-file", str(env_file)]
    if not rest:
        return args, []
    # the directory is reached only through the 0700 run directory; in the container the job's uid reads it
    values = rd.path / f"rank-{rank}.env.d"
    values.mkdir()
    write_text_atomic(values / "launch", LAUNCHER)
    write_text_atomic(values / "values", "".join(f"{k} {_escape(v)}\n" for k, v in rest.items()))
    for path, mode in ((values / "launch", 0o444), (values / "values", 0o444), (values, 0o555)):
        os.chmod(path, mode)  # whatever the server's umask: the job's uid reads them, nobody writes them
    return [*args, "--volume", f"{values}:{MOUNT}:ro"], [SHELL, f"{MOUNT}/launch"]
