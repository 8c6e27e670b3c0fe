"""Which OS identity a platform user's jobs run as.

Each platform user maps to one unprivileged uid (its gid is the same number), fixed in the database on first use so
the files a user's jobs leave keep their owner across restarts. The uid is that of an existing OS account with the
user's name when there is one (a lab's existing Unix logins), else of the account ``<prefix><username>``, created
here with a uid from the configured range.
"""

from __future__ import annotations

import grp
import pwd
import shutil
import subprocess

from sqlalchemy import select
from sqlalchemy.orm import Session

from caldera.config import Settings
from caldera.db.models import User
from caldera.runtime.base import RunAs
from caldera.server.errors import CalderaError

_FIRST_LOGIN_UID = 1000  # below are system accounts; root is never a job's identity


class IdentityError(CalderaError):
    status = 500


def run_as(settings: Settings, db: Session, user: User) -> RunAs | None:
    """The identity for ``user``'s jobs, or None when the admin chose to run jobs as the server's own user."""
    if settings.run_jobs_as == "server":
        return None
    if user.os_uid is None:
        user.os_uid = _choose_uid(settings, db, user.username)
        db.flush()
    return _ensure_account(settings, user.username, user.os_uid)


def _choose_uid(settings: Settings, db: Session, username: str) -> int:
    for name in (username, settings.os_user_prefix + username):
        try:
            uid = pwd.getpwnam(name).pw_uid
        except KeyError:
            continue
        if uid >= _FIRST_LOGIN_UID and db.scalar(select(User.id).where(User.os_uid == uid)) is None:
            return uid
    taken = set(db.scalars(select(User.os_uid).where(User.os_uid.is_not(None))))
    for uid in range(settings.job_uid_min, settings.job_uid_max + 1):
        if uid not in taken and not _uid_exists(uid) and not _gid_exists(uid):
            return uid
    raise IdentityError(f"no free uid left in {settings.job_uid_min}-{settings.job_uid_max} (job_uid_min/max)")


def _ensure_account(settings: Settings, username: str, uid: int) -> RunAs:
    """The OS account with ``uid``, created when it does not exist yet (tools such as pip want a passwd entry)."""
    try:
        entry = pwd.getpwuid(uid)
        return RunAs(entry.pw_name, uid, entry.pw_gid)
    except KeyError:
        pass
    name = settings.os_user_prefix + username
    useradd, groupadd = shutil.which("useradd"), shutil.which("groupadd")
    if not useradd or not groupadd:
        raise IdentityError("cannot create OS accounts for jobs: useradd/groupadd are missing")
    for cmd in (
        [groupadd, "-g", str(uid), name] if not _gid_exists(uid) else None,
        [
            useradd,
            "-u",
            str(uid),
            "-g",
            str(uid),
            "-M",
            "-N",
            "-d",
            "/nonexistent",
            "-s",
            "/usr/sbin/nologin",
            "-c",
            f"Caldera user {username}",
            name,
        ],
    ):
        if cmd is None:
            continue
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise IdentityError(f"cannot create OS account {name} (uid {uid}): {r.stderr.strip()}")
    return RunAs(name, uid, uid)


def _uid_exists(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


def _gid_exists(gid: int) -> bool:
    try:
        grp.getgrgid(gid)
        return True
    except KeyError:
        return False


def isolation_problem(settings: Settings, interpreter: str) -> str | None:
    """Why jobs could not run isolated as their owners on this host, or None when they can."""
    import os

    from caldera.runtime.local.owner import reachable_by_others

    if os.geteuid() != 0:
        return (
            f"the server runs as {pwd.getpwuid(os.geteuid()).pw_name}, not root, so it cannot run jobs as their "
            "owners: every job could read the platform's database and keys and act as any user. Run it as root, "
            "or accept this on a single-user machine with `caldera up --unisolated` (CALDERA_RUN_JOBS_AS=server)"
        )
    for what, path in (("the Python that runs jobs", interpreter), ("the workspaces", settings.workspaces)):
        blocked = reachable_by_others(path)
        if blocked is not None:
            return (
                f"{what} ({path}) cannot be reached by job users: {blocked} is not traversable by others. "
                f"Install Caldera outside a private home directory, or allow traversal: chmod o+x {blocked}"
            )
    return None
