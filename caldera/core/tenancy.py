"""Users, accounts (projects), queues and their quotas."""

from __future__ import annotations

from enum import Enum
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

from caldera.core.governance import Governance
from caldera.core.resources import is_resource_key


class Role(str, Enum):
    ADMIN = "admin"
    USER = "user"


class PriorityClass(str, Enum):
    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"
    BEST_EFFORT = "best-effort"  # runs only on idle capacity; the first to be preempted

    @property
    def rank(self) -> int:
        """Larger runs first."""
        return _RANK[self]


_RANK = {PriorityClass.HIGH: 3, PriorityClass.NORMAL: 2, PriorityClass.LOW: 1, PriorityClass.BEST_EFFORT: 0}


class Quota(BaseModel):
    """Limits on one resource for one queue. ``None`` means unlimited (capability) or none (guarantee)."""

    model_config = ConfigDict(extra="forbid")

    guarantee: float = Field(0.0, ge=0, strict=True, description="always available; reclaimed when needed")
    deserved: float | None = Field(None, ge=0, strict=True, description="weighted fair share; the guarantee if empty")
    capability: float | None = Field(None, ge=0, strict=True, description="hard ceiling")


class UserCaps(BaseModel):
    """Per-user limits inside one queue."""

    model_config = ConfigDict(extra="forbid")

    max_gpus: int | None = Field(None, ge=0, strict=True)
    max_interactive_jobs: int | None = Field(None, ge=0, strict=True)
    max_running_jobs: int | None = Field(None, ge=0, strict=True)


class QueueConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(..., pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$")
    account: str
    weight: float = Field(1.0, gt=0, le=1e6, strict=True, description="weight of this queue in fair sharing")
    quotas: dict[Annotated[str, Field(max_length=128)], Quota] = Field(
        default_factory=dict, max_length=64, description="keyed by cpu, memory, gpu or gpu/<model>"
    )
    user_caps: UserCaps = Field(default_factory=UserCaps)
    # classes above normal preempt and jump the queue, so an admin grants them: to everyone in the queue, or to
    # named users (their highest class here). Admins themselves may submit any class
    max_priority: PriorityClass = Field(PriorityClass.NORMAL, description="highest class anyone may submit here")
    priority_grants: dict[Annotated[str, Field(max_length=64)], PriorityClass] = Field(
        default_factory=dict, max_length=10_000, description="user name -> highest class that user may submit here"
    )
    # GPU sharing: the predicted slowdown a shareable job of this queue accepts when it names none itself
    decay_tolerance: float | None = Field(
        None, gt=0, le=1, strict=True, description="slowdown a shared job accepts; the platform default when empty"
    )
    # idle detection and runtime limits (caldera.governance)
    governance: Governance = Field(default_factory=Governance)

    def allows(self, username: str, priority: PriorityClass) -> bool:
        granted = self.priority_grants.get(username, self.max_priority)
        return priority.rank <= max(granted.rank, self.max_priority.rank)

    @field_validator("quotas")
    @classmethod
    def _known_keys(cls, v: dict[str, Quota]) -> dict[str, Quota]:
        for key in v:
            if not is_resource_key(key):
                raise ValueError(f"unknown resource {key!r}: use cpu, memory, gpu or gpu/<model>")
        return v
