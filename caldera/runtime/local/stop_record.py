"""The stop record both runtimes write before any signal: when SIGKILL is due (a second stop may shorten the grace,
never extend it) and, for a preemption, the notice the job finds in its scratch directory."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

from caldera.runtime.base import RunAs
from caldera.runtime.local import owner
from caldera.runtime.local.rundir import RunDir, read_json, write_json_atomic

NOTICE_FILE = "preempt-notice"


def record_stop(rd: RunDir, scratch: Path, run_as: RunAs | None, grace_s: float, notice: str | None) -> float:
    """Write the stop record (and the notice, before any SIGTERM: a handler may look for it); returns kill_at."""
    now = time.time()
    kill_at = now + max(0.0, grace_s)
    prev = read_json(rd.stop)
    if prev and prev.get("kill_at") is not None:
        kill_at = min(kill_at, prev["kill_at"])
    if notice is not None:
        text = notice if notice.endswith("\n") else notice + "\n"
        if "deadline" not in notice:
            text += f"deadline: {datetime.fromtimestamp(kill_at, UTC).isoformat()}\n"
        owner.write_owned(scratch / NOTICE_FILE, text, run_as, mode=0o644)
    write_json_atomic(
        rd.stop, {"requested_at": now, "grace_s": grace_s, "kill_at": kill_at, "preempt": notice is not None}
    )
    return kill_at
