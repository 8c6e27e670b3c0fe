"""A queue's governance rules (docs/governance.md): when an idle job is warned, flagged or stopped, and how long a
job of each kind may run. Stored in the queue's configuration; the decisions are in ``caldera.governance``."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from caldera.core.kinds import INTERACTIVE, is_interactive

DAY_S = 86400


class IdleRule(BaseModel):
    """A job whose every GPU averaged under ``threshold_percent`` over ``window_s`` is idle: it is warned, and
    stopped ``grace_s`` later unless it was used meanwhile (``stop``); else it is only flagged."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="watch this kind of job for idle GPUs")
    threshold_percent: float = Field(5.0, ge=0, le=100, description="mean GPU utilisation under this is idle")
    window_s: int = Field(7200, ge=1, le=30 * DAY_S, description="idle this long before the warning")
    grace_s: int = Field(3600, ge=0, le=30 * DAY_S, description="between the warning and the stop")
    stop: bool = Field(True, description="stop after the grace period; else only flag the job")


class Governance(BaseModel):
    model_config = ConfigDict(extra="forbid")

    idle_interactive: IdleRule = Field(
        default_factory=IdleRule, description="every interactive kind (Jupyter, and any kind that is not batch)"
    )
    idle_batch: IdleRule = Field(
        default_factory=lambda: IdleRule(enabled=False, window_s=6 * 3600, stop=False),
        description="batch and distributed jobs: off, and only flagged, unless the queue says so",
    )
    # job kind (batch, distributed, jupyter, ...) -> the longest it may run before it is stopped; "interactive":
    # every interactive kind not named; none: no limit
    max_runtime_s: dict[Annotated[str, Field(max_length=16)], Annotated[int, Field(ge=60)]] = Field(
        default_factory=lambda: {INTERACTIVE: 4 * DAY_S}, max_length=8
    )

    def idle_rule(self, kind: str) -> IdleRule:
        return self.idle_interactive if is_interactive(kind) else self.idle_batch

    def runtime_limit(self, kind: str) -> int | None:
        if kind in self.max_runtime_s:
            return self.max_runtime_s[kind]
        return self.max_runtime_s.get(INTERACTIVE) if is_interactive(kind) else None
