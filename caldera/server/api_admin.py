"""Users, accounts, queues (admins write; users read their own), nodes and usage."""

from __future__ import annotations

from fastapi import APIRouter, Depends, HTTPException
from pydantic import BaseModel, Field, ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from caldera.core.spec import spec_errors
from caldera.core.states import JobState
from caldera.core.tenancy import PriorityClass, QueueConfig, Role
from caldera.db.models import Account, Job, Usage, User
from caldera.runtime.base import OTHER_HOLDER, gpu_holders
from caldera.scheduler.quota import validate_queues
from caldera.server import audit, cordons, tenancy
from caldera.server.deps import admin_user, current_user, db_session, platform
from caldera.server.errors import Invalid, InvalidFields
from caldera.server.platform import Platform
from caldera.server.security import verify_password

router = APIRouter(prefix="/api/v1", tags=["admin"])


class UserIn(BaseModel):
    username: str = Field(..., pattern=r"^[a-z_][a-z0-9_.-]{0,63}$")
    password: str = Field(..., max_length=1024)
    role: Role = Role.USER
    accounts: list[str] = Field(default_factory=list, max_length=256)


class AccountIn(BaseModel):
    name: str = Field(..., pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$")
    description: str = Field("", max_length=4096)


class MemberIn(BaseModel):
    username: str = Field(..., max_length=64)


class PasswordIn(BaseModel):
    current_password: str = Field("", max_length=1024, description="required unless an admin resets another user's")
    password: str = Field(..., max_length=1024)


def _user_view(db: Session, u: User) -> dict:
    return {
        "id": u.id,
        "username": u.username,
        "role": u.role,
        "active": u.active,
        "default_account": u.default_account,
        "accounts": tenancy.user_accounts(db, u),
    }


@router.post("/users", status_code=201)
def create_user(body: UserIn, _: User = Depends(admin_user), db: Session = Depends(db_session)) -> dict:
    user = tenancy.create_user(db, body.username, body.password, body.role, body.accounts or None)
    audit.record(db, _, "create-user", body.username, {"role": body.role.value, "accounts": body.accounts})
    db.commit()
    return _user_view(db, user)


@router.get("/users")
def list_users(_: User = Depends(admin_user), db: Session = Depends(db_session)) -> list[dict]:
    return [_user_view(db, u) for u in db.scalars(select(User).order_by(User.username))]


def _change_password(p: Platform, db: Session, actor: User, target: User, body: PasswordIn) -> dict:
    """Your own password needs the current one (so a stolen session cannot lock you out); an admin resetting
    someone else's does not. Either way every login of the target made before now ends."""
    if actor.id == target.id and not verify_password(target.password_hash, body.current_password):
        raise Invalid("current_password", "wrong current password")
    tenancy.set_password(db, target, body.password)
    db.commit()
    if target.role == Role.ADMIN.value:
        (p.settings.data_dir / "initial-admin.txt").unlink(missing_ok=True)
    return {"ok": True, "username": target.username, "detail": "password changed; other logins were ended"}


@router.put("/me/password")
def change_password(
    body: PasswordIn,
    user: User = Depends(current_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
) -> dict:
    return _change_password(p, db, user, user, body)


@router.put("/users/{username}/password")
def reset_password(
    username: str,
    body: PasswordIn,
    admin: User = Depends(admin_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
) -> dict:
    target = tenancy.get_user(db, username)
    audit.record(db, admin, "reset-password", target.username)  # committed with the change, or not at all
    return _change_password(p, db, admin, target, body)


@router.post("/accounts", status_code=201)
def create_account(body: AccountIn, _: User = Depends(admin_user), db: Session = Depends(db_session)) -> dict:
    acc = tenancy.create_account(db, body.name, body.description)
    audit.record(db, _, "create-account", body.name)
    db.commit()
    return {"name": acc.name, "description": acc.description}


@router.get("/accounts")
def list_accounts(user: User = Depends(current_user), db: Session = Depends(db_session)) -> list[dict]:
    mine = set(tenancy.user_accounts(db, user))
    rows = db.scalars(select(Account).order_by(Account.name))
    return [
        {"name": a.name, "description": a.description, "member": a.name in mine}
        for a in rows
        if user.role == Role.ADMIN.value or a.name in mine
    ]


@router.post("/accounts/{name}/members", status_code=201)
def add_member(name: str, body: MemberIn, _: User = Depends(admin_user), db: Session = Depends(db_session)) -> dict:
    tenancy.add_member(db, name, tenancy.get_user(db, body.username))
    audit.record(db, _, "add-member", name, {"username": body.username})
    db.commit()
    return {"account": name, "username": body.username}


@router.delete("/accounts/{name}/members/{username}")
def remove_member(name: str, username: str, _: User = Depends(admin_user), db: Session = Depends(db_session)) -> dict:
    tenancy.remove_member(db, name, tenancy.get_user(db, username))
    audit.record(db, _, "remove-member", name, {"username": username})
    db.commit()
    return {"account": name, "username": username, "removed": True}


@router.put("/queues/{name}")
def put_queue(
    name: str,
    body: dict,
    _: User = Depends(admin_user),
    p: Platform = Depends(platform),
    db: Session = Depends(db_session),
) -> dict:
    """Create or replace a queue. Refused when the whole set of queues could not hold on this cluster. Priority
    grants (``max_priority``, ``priority_grants``) are kept when the body leaves them out."""
    queues = tenancy.all_queue_configs(db)
    kept = queues[name].model_dump(mode="json", include={"max_priority", "priority_grants"}) if name in queues else {}
    try:
        cfg = QueueConfig.model_validate({**kept, **body, "name": name})
    except ValidationError as exc:
        raise InvalidFields(spec_errors(exc)) from None
    tenancy.get_account(db, cfg.account)
    queues[name] = cfg
    problems = validate_queues(list(queues.values()), p.nodes())
    if problems:
        raise InvalidFields([{"field": "quotas", "reason": m} for m in problems])
    tenancy.put_queue(db, cfg)
    audit.record(db, _, "put-queue", name, body)
    db.commit()
    return cfg.model_dump(mode="json")


class GrantIn(BaseModel):
    max_priority: PriorityClass = Field(..., description="the highest class this user may submit in this queue")


@router.put("/queues/{name}/grants/{username}")
def grant_priority(
    name: str, username: str, body: GrantIn, _: User = Depends(admin_user), db: Session = Depends(db_session)
) -> dict:
    """Let one user submit classes up to ``max_priority`` in this queue."""
    user = tenancy.get_user(db, username)
    q, account = tenancy.get_queue(db, name)
    cfg = tenancy.queue_config(q, account)
    cfg.priority_grants[user.username] = body.max_priority
    tenancy.put_queue(db, cfg)
    audit.record(db, _, "grant-priority", name, {"username": username, "max_priority": body.max_priority.value})
    db.commit()
    return cfg.model_dump(mode="json")


@router.delete("/queues/{name}/grants/{username}")
def revoke_priority(name: str, username: str, _: User = Depends(admin_user), db: Session = Depends(db_session)) -> dict:
    q, account = tenancy.get_queue(db, name)
    cfg = tenancy.queue_config(q, account)
    if cfg.priority_grants.pop(username, None) is None:
        raise HTTPException(404, f"{username!r} has no grant in queue {name!r}")
    tenancy.put_queue(db, cfg)
    audit.record(db, _, "revoke-priority", name, {"username": username})
    db.commit()
    return cfg.model_dump(mode="json")


def _queue_usage(db: Session, queue: str) -> dict:
    """What runs in a queue now, per resource key and per user, and its decayed fair-share usage."""
    from caldera.core.resources import Resources, add_vectors

    names = tenancy.usernames(db)
    total: dict[str, float] = {}
    per_user: dict[str, dict[str, float]] = {}
    for job in db.scalars(
        select(Job).where(Job.queue == queue, Job.state.in_((JobState.STARTING.value, JobState.RUNNING.value)))
    ):
        vec = Resources(**job.spec.get("resources", {})).vector(job.spec.get("replicas", 1))
        total = add_vectors(total, vec)
        u = names.get(job.user_id, "?")
        per_user[u] = add_vectors(per_user.get(u, {}), vec)
    row = db.get(Usage, f"queue:{queue}")
    return {"in_use": total, "by_user": per_user, "decayed_gpu_seconds": row.value if row else 0.0}


@router.get("/queues")
def list_queues(user: User = Depends(current_user), db: Session = Depends(db_session)) -> list[dict]:
    return [
        {**cfg.model_dump(mode="json"), "usage": _queue_usage(db, cfg.name)}
        for cfg in tenancy.visible_queue_configs(db, user)
    ]


@router.get("/queues/{name}")
def get_queue(name: str, user: User = Depends(current_user), db: Session = Depends(db_session)) -> dict:
    q, account = tenancy.get_queue(db, name)
    if user.role != Role.ADMIN.value and not tenancy.is_member(db, user, account):
        raise HTTPException(404, f"no queue {name!r}")
    return {**tenancy.queue_config(q, account).model_dump(mode="json"), "usage": _queue_usage(db, name)}


@router.get("/usage")
def my_usage(user: User = Depends(current_user), db: Session = Depends(db_session)) -> dict:
    """A user's own usage and limits: what they run in each of their queues, against its caps."""
    row = db.get(Usage, f"user:{user.username}")
    queues = []
    for cfg in tenancy.all_queue_configs(db).values():
        if cfg.account in tenancy.user_accounts(db, user):
            usage = _queue_usage(db, cfg.name)
            queues.append(
                {
                    "queue": cfg.name,
                    "account": cfg.account,
                    "mine": usage["by_user"].get(user.username, {}),
                    "queue_in_use": usage["in_use"],
                    "user_caps": cfg.user_caps.model_dump(),
                    "quotas": {k: v.model_dump() for k, v in cfg.quotas.items()},
                }
            )
    return {"user": user.username, "decayed_gpu_seconds": row.value if row else 0.0, "queues": queues}


@router.get("/nodes")
def nodes(
    user: User = Depends(current_user), p: Platform = Depends(platform), db: Session = Depends(db_session)
) -> list:
    """Nodes and which devices are free now (the idle resources view)."""
    used: dict[str, dict[int, str]] = {}
    admin = user.role == Role.ADMIN.value
    active = db.scalars(select(Job).where(Job.state.in_((JobState.STARTING.value, JobState.RUNNING.value)))).all()
    shown = {job.id: job.id if admin or job.user_id == user.id else "busy" for job in active}  # others': busy
    for job in active:
        for a in job.allocations:
            for g in a["gpus"]:
                used.setdefault(a["node"], {})[g] = shown[job.id]
    # a cluster that places jobs itself (Kubernetes) says who holds its GPUs: Caldera's jobs, or someone else's pods
    for node, holders in (gpu_holders(p.runtime) or {}).items():
        used[node] = {i: _holder(h, shown, admin) for i, h in enumerate(holders) if h is not None}
    cordoned = cordons.by_node(db)
    return [
        {
            "name": n.name,
            "cpu": n.cpu,
            "memory_mib": n.memory_mib,
            "schedulable": n.schedulable and n.name not in cordoned,
            "cordon": cordons.view(cordoned.get(n.name)),
            "gpus": [
                {
                    "index": d.index,
                    "model": d.model,
                    "memory_mib": d.memory_mib,
                    "job": used.get(n.name, {}).get(d.index),
                }
                for d in n.gpus
            ],
        }
        for n in p.nodes()
    ]


def _holder(holder: str, shown: dict[str, str], admin: bool) -> str:
    """A GPU holder as the user may see it: a Caldera job (by id if it is theirs, or they are admin), or a pod
    Caldera did not start (OTHER_HOLDER)."""
    if holder in shown:
        return shown[holder]
    return holder if holder == OTHER_HOLDER or admin else "busy"  # e.g. an ended attempt's pod still stopping
