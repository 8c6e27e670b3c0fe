"""Users, accounts (projects), queues and their quotas."""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict, Field, field_validator

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

    guarantee: float = Field(0.0, ge=0, description="always available; reclaimed from others when needed")
    deserved: float | None = Field(None, ge=0, description="weighted fair share; defaults to the guarantee")
    capability: float | None = Field(None, ge=0, description="hard ceiling")


class UserCaps(BaseModel):
    """Per-user limits inside one queue."""

    model_config = ConfigDict(extra="forbid")

    max_gpus: int | None = Field(None, ge=0)
    max_interactive_jobs: int | None = Field(None, ge=0)
    max_running_jobs: int | None = Field(None, ge=0)


class QueueConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(..., pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$")
    account: str
    weight: float = Field(1.0, gt=0, description="weight of this queue in fair sharing")
    quotas: dict[str, Quota] = Field(default_factory=dict, description="keyed by cpu, memory, gpu or gpu/<model>")
    user_caps: UserCaps = Field(default_factory=UserCaps)

    @field_validator("quotas")
    @classmethod
    def _known_keys(cls, v: dict[str, Quota]) -> dict[str, Quota]:
        for key in v:
            if not is_resource_key(key):
                raise ValueError(f"unknown resource {key!r}: use cpu, memory, gpu or gpu/<model>")
        return v
