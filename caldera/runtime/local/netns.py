"""A private network namespace for the ranks of one distributed job.

torch's TCPStore (MASTER_PORT) and gloo listen on every address, and servers on this host must not. All ranks of a
job join one fresh namespace that has only loopback, so they reach each other on 127.0.0.1 and nothing else can
reach them.

A holder process (``unshare --net``) creates the namespace and brings lo up; each rank is started through
``nsenter --net=/proc/<holder>/ns/net``, which execs the shim in place (same pid). Once every rank is inside, the
ranks themselves keep the namespace alive, so the holder is removed as soon as the launch is over: nothing is left
to clean up when the job ends, is stopped, or the server dies, and re-attaching needs nothing from it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass

from caldera.runtime.local import procs
from caldera.runtime.local.launchfile import root_env


def available() -> bool:
    return os.geteuid() == 0 and all(shutil.which(t) for t in ("unshare", "nsenter", "ip"))


@dataclass
class Holder:
    proc: subprocess.Popen[bytes]
    start: int | None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def enter_prefix(self) -> list[str]:
        return [shutil.which("nsenter") or "nsenter", f"--net=/proc/{self.pid}/ns/net", "--"]

    def release(self) -> None:
        procs.signal_verified(self.pid, self.start, signal.SIGKILL)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def start_holder(timeout_s: float = 15.0) -> Holder:
    """Create the namespace; raises RuntimeError if it cannot (we never fall back to the host network silently)."""
    proc = subprocess.Popen(
        [shutil.which("unshare") or "unshare", "--net", "sh", "-c", "ip link set lo up && exec sleep infinity"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env=root_env(),
    )
    holder = Holder(proc, procs.start_time(proc.pid))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
            raise RuntimeError(f"cannot create a network namespace: {err or f'exit {proc.returncode}'}")
        try:
            with open(f"/proc/{proc.pid}/comm") as f:
                if f.read().strip() == "sleep":  # sh exec'd sleep: lo is up
                    if proc.stderr:
                        proc.stderr.close()
                    return holder
        except OSError:
            pass
        time.sleep(0.02)
    holder.release()
    raise RuntimeError("timed out creating a network namespace")
