"""asyncssh's SSH server for one connection, as the job's user, on stdin and stdout: what
``caldera.runtime.job_sshd`` runs where the job has no OpenSSH server (see there). Sessions: a shell or a command
(with a terminal when the client asks), SFTP and scp, and TCP or Unix-socket forwarding inside the job (VSCode
Remote-SSH reaches its server that way).

Its source is handed to the job's Python with ``-c``: it needs nothing but the standard library and asyncssh.
"""

from __future__ import annotations

import argparse
import asyncio
import fcntl
import os
import pwd
import shutil
import socket
import struct
import sys
import termios
import threading

import asyncssh

_CHUNK = 1 << 16


def host_key(path: str) -> asyncssh.SSHKey:
    try:
        return asyncssh.read_private_key(path)
    except (OSError, asyncssh.KeyImportError):
        pass
    key = asyncssh.generate_private_key("ssh-ed25519")
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:  # a connection beside this one made it first
        return asyncssh.read_private_key(path)
    with os.fdopen(fd, "wb") as f:
        f.write(key.export_private_key())
    return key


def _bridge(sock: socket.socket) -> None:
    """stdin into ``sock`` and ``sock`` out to stdout, each in a thread, until each side ends."""

    def inbound() -> None:
        try:
            while data := os.read(0, _CHUNK):
                sock.sendall(data)
        except OSError:
            pass
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def outbound() -> None:
        try:
            while data := sock.recv(_CHUNK):
                view = memoryview(data)
                while view:
                    view = view[os.write(1, view) :]
        except OSError:
            pass

    for fn in (inbound, outbound):
        threading.Thread(target=fn, daemon=True).start()


class _Server(asyncssh.SSHServer):
    def begin_auth(self, username: str) -> bool:
        return True  # the name is not checked: the key is (this server has one user, its own)

    def password_auth_supported(self) -> bool:
        return False

    def connection_requested(self, dest_host: str, dest_port: int, orig_host: str, orig_port: int) -> bool:
        return True  # from inside the job, as its user: what the job could reach itself

    def unix_connection_requested(self, dest_path: str) -> bool:
        return True


class _Sftp(asyncssh.SFTPServer):
    """asyncssh's SFTP server (the job's files as its user), ending with an exit status as OpenSSH's does: scp
    counts a session without one as failed."""

    def exit(self) -> None:
        super().exit()
        self.channel.exit(0)


def _set_size(fd: int, cols: int, rows: int) -> None:
    if cols and rows:
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


async def _read_fd(fd: int) -> bytes:
    try:
        return await asyncio.get_running_loop().run_in_executor(None, os.read, fd, _CHUNK)
    except OSError:  # EIO: the terminal's other end is gone
        return b""


def _shell() -> str:
    """The user's login shell; job users the platform made have none (nologin): bash, else sh, then."""
    try:
        shell = pwd.getpwuid(os.getuid()).pw_shell
    except KeyError:  # a uid without a passwd entry (a container's)
        shell = ""
    if shell and os.path.basename(shell) not in ("nologin", "false"):
        return shell
    return shutil.which("bash") or "/bin/sh"


async def _session(process: asyncssh.SSHServerProcess) -> None:
    shell = _shell()
    argv = [shell, "-c", process.command] if process.command else [shell, "-l"]
    env = dict(os.environ)
    term = process.get_terminal_type()
    try:
        if term:
            env["TERM"] = term
            code = await _on_terminal(process, argv, env)
        else:
            code = await _on_pipes(process, argv, env)
    except OSError as exc:
        process.stderr.write(f"{argv[0]}: {exc.strerror}\n".encode())
        code = 127
    process.exit(code)


async def _on_terminal(process: asyncssh.SSHServerProcess, argv: list[str], env: dict[str, str]) -> int:
    master, slave = os.openpty()
    cols, rows, _, _ = process.get_terminal_size()
    _set_size(master, cols, rows)
    setsid = shutil.which("setsid") or "setsid"
    proc = await asyncio.create_subprocess_exec(
        setsid, "--ctty", "--", *argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=env.get("HOME", "/")
    )
    os.close(slave)

    async def keys() -> None:
        while True:
            try:
                data = await process.stdin.read(_CHUNK)
            except asyncssh.TerminalSizeChanged as change:
                _set_size(master, change.width, change.height)
                continue
            except asyncssh.BreakReceived:
                continue
            if not data:
                return
            os.write(master, data)

    typing = asyncio.create_task(keys())
    while data := await _read_fd(master):
        process.stdout.write(data)
        await process.stdout.drain()
    typing.cancel()
    os.close(master)
    return await proc.wait()


async def _on_pipes(process: asyncssh.SSHServerProcess, argv: list[str], env: dict[str, str]) -> int:
    PIPE = asyncio.subprocess.PIPE
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=PIPE, stdout=PIPE, stderr=PIPE, env=env, cwd=env.get("HOME", "/")
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None

    async def feed() -> None:
        try:
            while data := await process.stdin.read(_CHUNK):
                proc.stdin.write(data)
                await proc.stdin.drain()
        except (asyncssh.Error, ConnectionError, asyncssh.TerminalSizeChanged):
            pass
        proc.stdin.close()

    async def drain(source: asyncio.StreamReader, sink: asyncssh.SSHWriter) -> None:
        while data := await source.read(_CHUNK):
            sink.write(data)
            await sink.drain()

    feeding = asyncio.create_task(feed())
    await asyncio.gather(drain(proc.stdout, process.stdout), drain(proc.stderr, process.stderr))
    feeding.cancel()
    return await proc.wait()


async def serve(authorized_keys: str, key_path: str) -> None:
    ours, theirs = socket.socketpair()
    _bridge(theirs)
    conn = await asyncssh.connect_reverse(
        sock=ours,
        server_factory=_Server,
        server_host_keys=[host_key(key_path)],
        authorized_client_keys=asyncssh.import_authorized_keys(authorized_keys),
        process_factory=_session,
        encoding=None,
        sftp_factory=_Sftp,
        allow_scp=True,
        agent_forwarding=False,
        x11_forwarding=False,
    )
    await conn.wait_closed()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="caldera-job-asyncssh")
    ap.add_argument("--authorized-keys", required=True, help="the owner's public keys, one OpenSSH line each")
    ap.add_argument("--host-key", default=os.path.expanduser("~/.config/caldera/ssh_host_ed25519_key"))
    args = ap.parse_args(argv)
    try:
        os.chdir(os.path.expanduser("~"))  # where scp's and sftp's relative paths start, as with OpenSSH
    except OSError:
        pass
    try:
        asyncio.run(serve(args.authorized_keys, args.host_key))
    except (OSError, asyncssh.Error) as exc:
        print(f"caldera job sshd: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
