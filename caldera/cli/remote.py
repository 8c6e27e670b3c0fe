"""Into a running job of mine, over the platform's websockets with my token: ``caldera exec`` (a command, or with
``-it`` a shell: ``/api/v1/jobs/<id>/exec``, see ``caldera.server.api_exec``) and ``caldera ssh`` (OpenSSH's own
client through ``caldera ssh --stdio`` as its ProxyCommand: ``/api/v1/jobs/<id>/ssh``, see
``caldera.server.ssh_relay``), with ``caldera ssh-config`` for a host alias that ssh, scp, rsync and VSCode's
Remote-SSH use."""

from __future__ import annotations

import json
import os
import select
import shlex
import shutil
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import typer

from caldera.cli.common import client, err

_STDOUT, _STDERR = 1, 2
_CHUNK = 1 << 20  # caldera ssh --stdio's largest read and message: the platform reads the job's pipes as much
_BULK = 16 << 10  # a read this large is part of a bulk transfer (an SSH packet of scp's is up to 32 KiB)
_BATCH_WAIT_S = 0.002


def _ws_url(http_url: str, path: str) -> str:
    scheme, _, rest = http_url.partition("://")
    return f"{'wss' if scheme == 'https' else 'ws'}://{rest.rstrip('/')}{path}"


def connect(path: str):  # noqa: ANN201 - a websockets client connection
    """A websocket to the platform at ``path``, authenticated with the CLI's token."""
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect as ws_connect

    c = client()
    try:
        return ws_connect(
            _ws_url(c.url, path),
            additional_headers={"Authorization": c.http.headers["authorization"]},
            max_size=None,
            open_timeout=30,
            compression=None,  # SSH's stream is encrypted, a terminal's is small: deflate only costs CPU
        )
    except InvalidStatus as exc:
        try:
            detail = json.loads(exc.response.body or b"{}").get("detail", "")
        except ValueError:
            detail = ""
        err.print(f"[red]error {exc.response.status_code}: {detail or 'refused'}[/red]")
        raise typer.Exit(1) from None


@contextmanager
def _raw_terminal(enabled: bool) -> Iterator[None]:
    if not enabled:
        yield
        return
    import termios
    import tty

    saved = termios.tcgetattr(0)
    tty.setraw(0)
    try:
        yield
    finally:
        termios.tcsetattr(0, termios.TCSADRAIN, saved)


def _send_stdin(ws) -> None:  # noqa: ANN001
    try:
        while chunk := os.read(0, 65536):
            ws.send(chunk)
        ws.send(json.dumps({"eof": True}))
    except Exception:  # noqa: BLE001 - the session is over: nothing to send to
        pass


def exec_command(
    job_id: str = typer.Argument(..., help="a running job of yours"),
    command: list[str] = typer.Argument(..., help="the command, after --: caldera exec JOB -- nvidia-smi"),
    rank: int = typer.Option(0, "--rank", "-r", min=0, help="which rank of a distributed job"),
    interactive: bool = typer.Option(False, "--interactive", "-i", help="pass my standard input to the command"),
    tty: bool = typer.Option(False, "--tty", "-t", help="on a terminal (a shell: caldera exec -it JOB -- bash)"),
) -> None:
    """Run a command inside a running job of yours, as the job's user; exits with the command's exit code."""
    tty = tty and os.isatty(0)
    size = shutil.get_terminal_size()
    ws = connect(f"/api/v1/jobs/{job_id}/exec")
    first = {"argv": command, "rank": rank, "tty": tty, "rows": size.lines, "cols": size.columns,
             "term": os.environ.get("TERM", "")}  # fmt: skip
    ws.send(json.dumps(first))
    if interactive:
        threading.Thread(target=_send_stdin, args=(ws,), daemon=True).start()
    else:
        ws.send(json.dumps({"eof": True}))
    if tty:
        signal.signal(
            signal.SIGWINCH,
            lambda *_: ws.send(json.dumps({"resize": list(shutil.get_terminal_size()[::-1])})),
        )
    code = 255
    with _raw_terminal(tty):
        for msg in ws:
            if isinstance(msg, bytes):
                out = sys.stderr if msg[:1] == bytes([_STDERR]) else sys.stdout
                out.buffer.write(msg[1:])
                out.buffer.flush()
                continue
            end = json.loads(msg)
            if "exit" in end:
                code = end["exit"]
            else:
                print(f"caldera exec: {end.get('message') or end.get('error')}", file=sys.stderr)
    raise typer.Exit(code)


ALIAS_PREFIX = "caldera-"  # ssh's host alias of a job: caldera-<job id>
_HOST_KEY_ALIAS = "caldera-jobs"  # every job of mine shows the same host key (kept in my workspace)


def _proxy_command() -> str:
    return f"{shlex.quote(sys.executable)} -m caldera.cli.main ssh --stdio"


def ssh_command(
    job_id: str = typer.Argument(..., help="a running job of yours, or its alias caldera-<job>"),
    command: list[str] | None = typer.Argument(None, help="a command to run instead of a shell, after --"),
    rank: int = typer.Option(0, "--rank", "-r", min=0, help="which rank of a distributed job"),
    stdio: bool = typer.Option(False, "--stdio", help="be ssh's ProxyCommand: the SSH stream on stdin and stdout"),
    identity: Path | None = typer.Option(None, "--identity", "-i", help="the private key (ssh's -i)"),
) -> None:
    """SSH into a running job of yours (OpenSSH's ssh, through the platform; your registered keys)."""
    job_id = job_id.removeprefix(ALIAS_PREFIX)
    if stdio:
        _relay_stdio(job_id, rank)
        return
    ssh = shutil.which("ssh")
    if ssh is None:
        err.print("[red]ssh not found: install OpenSSH's client[/red]")
        raise typer.Exit(1)
    proxy = f"{_proxy_command()} --rank {rank} {shlex.quote(job_id)}"
    argv = [ssh, "-o", f"ProxyCommand={proxy}", "-o", f"HostKeyAlias={_HOST_KEY_ALIAS}"]
    if identity is not None:
        argv += ["-i", str(identity)]
    argv += ["--", f"caldera@{ALIAS_PREFIX}{job_id}", *(command or [])]
    os.execv(ssh, argv)


def _relay_stdio(job_id: str, rank: int) -> None:
    """ssh's stream (stdin, stdout) to the job's SSH server and back. Bulk transfers (scp, rsync) are bound by the
    CPU each message costs here and on the platform, so each is as large as ssh's pipe holds: its buffer is enlarged
    and read whole, and what comes back is written with no buffering of ours between."""
    ws = connect(f"/api/v1/jobs/{job_id}/ssh?rank={rank}")
    for fd in (0, 1):
        _enlarge_pipe(fd)

    def upstream() -> None:
        try:
            while chunk := _read_batch(0):
                ws.send(chunk)
        except Exception:  # noqa: BLE001 - the session is over
            pass
        ws.close()

    threading.Thread(target=upstream, daemon=True).start()
    try:
        for msg in ws:
            if isinstance(msg, bytes):
                _write_all(1, msg)
    except Exception:  # noqa: BLE001 - a connection that broke ends the stream, as a closed one does
        pass


def _read_batch(fd: int) -> bytes:
    """What ``fd`` has, waiting up to ``_BATCH_WAIT_S`` for more while it comes in bulk (full SSH packets):
    fewer, larger messages, each costing CPU here and on the platform; a keystroke's packet goes at once."""
    chunk = os.read(fd, _CHUNK)
    if len(chunk) < _BULK:
        return chunk
    parts, size = [chunk], len(chunk)
    while size < _CHUNK and select.select([fd], [], [], _BATCH_WAIT_S)[0]:
        more = os.read(fd, _CHUNK - size)
        if not more:
            break
        parts.append(more)
        size += len(more)
    return b"".join(parts)


def _enlarge_pipe(fd: int) -> None:
    import fcntl

    try:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, _CHUNK)
    except OSError:  # not a pipe, or over /proc/sys/fs/pipe-max-size: as it is
        pass


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def ssh_config() -> None:
    """Print an ssh_config block: `ssh caldera-<job>`, scp, rsync and VSCode's Remote-SSH then reach your jobs."""
    print(
        f"Host {ALIAS_PREFIX}*\n"
        f"    ProxyCommand {_proxy_command()} %n\n"
        "    User caldera\n"
        f"    HostKeyAlias {_HOST_KEY_ALIAS}\n"
        "    ServerAliveInterval 30"
    )


def register(app: typer.Typer) -> None:
    app.command("exec")(exec_command)
    app.command("ssh")(ssh_command)
    app.command("ssh-config")(ssh_config)
