"""SSH into a running job of mine: ``/api/v1/jobs/<id>/ssh?rank=N``, a websocket whose binary messages are the SSH
stream both ways, relayed to an SSH server inside the job (``caldera.runtime.job_sshd``: OpenSSH's ``sshd -i``
where the job has it, else asyncssh's).

For each connection the relay starts that server through ``Runtime.exec``, so it runs as the job's uid in the job's
namespaces or container, speaking SSH on its stdin and stdout: no port is opened anywhere, and only this relay,
after the platform's own login, reaches it. The SSH layer is end to end between the user's ``ssh`` and that server:
the platform carries bytes it cannot read. The server accepts only the owner's keys as the platform holds them now
(handed to it as arguments), so a key removed stops new sessions.

Who: the owner, with a bearer token (``caldera ssh --stdio``: the CLI's); the browser's session cookie does not
count here, and a handshake naming an Origin must name the platform's (see ``api_exec.authorise``). The session ends
with the job, as a terminal's does.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from fastapi import APIRouter, Query, WebSocket

from caldera.runtime import job_asyncssh, job_sshd
from caldera.runtime.base import ExecError, Handle
from caldera.server.api_exec import Refused, Target, authorise, counted, deny, output, pump_input, watch_job
from caldera.server.params import DB_INT_MAX
from caldera.server.platform import Platform
from caldera.server.user_keys import authorized_keys

router = APIRouter(tags=["jobs"])
_LAUNCHER_SOURCE = Path(job_sshd.__file__).read_text()
_ASYNCSSH_SOURCE = Path(job_asyncssh.__file__).read_text()


def _keys(p: Platform, user_id: int) -> str:
    with p.session() as db:
        return authorized_keys(db, user_id)


@router.websocket("/api/v1/jobs/{job_id}/ssh")
async def ssh_ws(websocket: WebSocket, job_id: str, rank: int = Query(0, ge=0, le=DB_INT_MAX)) -> None:
    p: Platform = websocket.app.state.platform
    try:
        target = await asyncio.to_thread(authorise, p, websocket, job_id[:200], False)
        if rank >= target.world_size:
            raise Refused(400, f"rank {rank} does not exist")
        keys = await asyncio.to_thread(_keys, p, target.user_id)
        if not keys:
            raise Refused(409, "you have no SSH key: add one (caldera keys add, or the tokens and keys page)")
    except Refused as exc:
        await deny(websocket, exc.status, exc.detail)
        return
    async with counted(websocket, target) as admitted:
        if admitted:
            await _relay(p, websocket, target, rank, keys)


async def _relay(p: Platform, websocket: WebSocket, t: Target, rank: int, keys: str) -> None:
    runtime = p.runtime_of(t.runtime, t.handle)
    python = getattr(runtime, "job_python", "python3")
    argv = [python, "-c", _LAUNCHER_SOURCE, "--authorized-keys", keys, "--server", p.settings.ssh_server,
            "--asyncssh-source", _ASYNCSSH_SOURCE]  # fmt: skip
    try:
        proc = await asyncio.to_thread(runtime.exec, Handle(t.job_id, t.attempt, t.handle), rank, argv, False)
    except ExecError as exc:
        await deny(websocket, 409, str(exc))
        return
    await websocket.accept()
    stdout = next(fd for stream, fd in proc.outputs() if stream == 1)
    tasks = [
        asyncio.create_task(output(websocket, proc, stdout, b"")),
        asyncio.create_task(pump_input(websocket, proc)),
        asyncio.create_task(watch_job(p, t, proc)),
    ]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        proc.kill()
        await asyncio.to_thread(proc.wait)
        proc.close()
        try:
            await websocket.close()
        except RuntimeError:
            pass
