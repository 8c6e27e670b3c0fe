"""What the home page and the job forms show, read through the API's own functions (no queries of their own)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy.orm import Session

from caldera.core.resources import GPU, gpu_key
from caldera.db.models import User
from caldera.server import api_admin
from caldera.server.platform import Platform


def nodes_now(p: Platform, db: Session, user: User) -> list[dict]:
    """Nodes and which of their GPUs are busy (the API's /nodes: others' jobs show only as busy)."""
    return api_admin.nodes(user=user, p=p, db=db)


def free_gpus(nodes: list[dict]) -> list[dict]:
    """Per GPU model: how many are idle now on schedulable nodes, of how many."""
    per_model: dict[str, dict] = {}
    for node in nodes:
        for d in node["gpus"]:
            row = per_model.setdefault(d["model"], {"model": d["model"], "free": 0, "total": 0})
            row["total"] += 1
            row["free"] += int(node["schedulable"] and d["job"] is None)
    return sorted(per_model.values(), key=lambda r: r["model"])


def _headroom(cap: float | None, used: float) -> float:
    return float("inf") if cap is None else cap - used


def largest_now(nodes: list[dict], queue: dict) -> int:
    """The most GPUs one single-node job of this user could get in this queue right now: idle GPUs of one model on
    one node, within what the queue's capabilities and the user's cap leave. Jobs queued ahead and reclaiming
    guarantees are not counted: the scheduler may still decide otherwise."""
    quotas, used = queue["quotas"], queue["queue_in_use"]
    mine = queue["mine"].get(GPU, 0.0)
    left = min(_headroom(_cap(quotas, GPU), used.get(GPU, 0.0)), _headroom(queue["user_caps"].get("max_gpus"), mine))
    best = 0
    for node in (n for n in nodes if n["schedulable"]):
        idle: dict[str, int] = {}
        for d in node["gpus"]:
            idle[d["model"]] = idle.get(d["model"], 0) + int(d["job"] is None)
        for model, n in idle.items():
            key = gpu_key(model)
            fits = min(n, left, _headroom(_cap(quotas, key), used.get(key, 0.0)))
            best = max(best, int(max(0, fits)))
    return best


def my_queues(db: Session, user: User) -> list[dict]:
    """The user's queues with their usage in them and the queue's caps (the API's /usage)."""
    return api_admin.my_usage(user=user, db=db)["queues"]


@dataclass
class QueueChoice:
    """What a job form may offer in one queue: GPU models and the most GPUs per replica."""

    name: str
    account: str
    models: list[str] = field(default_factory=list)
    max_gpu: int = 0


def _cap(quotas: dict, key: str) -> float | None:
    q = quotas.get(key)
    return None if q is None else q.get("capability")


def queue_choices(p: Platform, queues: list[dict]) -> list[QueueChoice]:
    nodes = [n for n in p.nodes() if n.schedulable]
    models = sorted({d.model for n in nodes for d in n.gpus})
    most_on_a_node = max((len(n.gpus) for n in nodes), default=0)
    out = []
    for q in queues:
        limits = [most_on_a_node, _cap(q["quotas"], GPU), q["user_caps"].get("max_gpus")]
        allowed = [m for m in models if _cap(q["quotas"], gpu_key(m)) != 0]
        most = int(min(x for x in limits if x is not None)) if allowed else 0
        out.append(QueueChoice(q["queue"], q["account"], allowed, most))
    return out
