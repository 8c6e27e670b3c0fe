"""``caldera exec``: a command, or with ``-it`` a shell, inside a running job of mine, over the platform's
websocket (``/api/v1/jobs/<id>/exec``, see ``caldera.server.api_exec``) with my token."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import typer

from caldera.cli.common import client, err

_STDOUT, _STDERR = 1, 2


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


def register(app: typer.Typer) -> None:
    app.command("exec")(exec_command)
