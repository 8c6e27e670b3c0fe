"""The job spec users submit (JSON through the API or YAML through the CLI)."""

from __future__ import annotations

import shlex
from enum import Enum
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from caldera.core.resources import Resources
from caldera.core.tenancy import PriorityClass


class JobKind(str, Enum):
    BATCH = "batch"
    DISTRIBUTED = "distributed"  # PyTorch distributed: replicas x procs_per_replica ranks, gang-scheduled
    JUPYTER = "jupyter"  # Jupyter Lab behind the platform's proxy


class JobSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(..., min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    kind: JobKind = JobKind.BATCH
    command: list[str] | None = Field(None, description="argv, or a shell string split with shlex")
    env: dict[str, str] = Field(default_factory=dict)
    workdir: str | None = Field(None, description="working directory; a fresh one per job when empty")
    account: str | None = Field(None, description="the account (project) to charge; the user's default when empty")
    queue: str | None = Field(None, description="queue in the account; the account's default queue when empty")
    priority: PriorityClass = PriorityClass.NORMAL
    resources: Resources = Field(default_factory=Resources, description="per replica")
    replicas: int = Field(1, ge=1, le=1024)
    procs_per_replica: int = Field(1, ge=1, le=64)
    max_runtime_s: int | None = Field(None, ge=1, description="runtime limit; lets the job backfill")
    preemptible: bool = Field(
        True, description="false: the job is not preempted for jobs with less attained service (batch jobs only)"
    )

    @field_validator("command", mode="before")
    @classmethod
    def _split(cls, v: Any) -> Any:
        if isinstance(v, str):
            return shlex.split(v)
        return v

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        for k in v:
            if not k or not (k[0].isalpha() or k[0] == "_") or not all(c.isalnum() or c == "_" for c in k):
                raise ValueError(f"invalid environment variable name {k!r}")
        return v

    @model_validator(mode="after")
    def _kind_rules(self) -> JobSpec:
        if self.kind is not JobKind.JUPYTER and not self.command:
            raise ValueError(f"a {self.kind.value} job needs a command")
        if self.kind is not JobKind.DISTRIBUTED and (self.replicas != 1 or self.procs_per_replica != 1):
            raise ValueError("replicas and procs_per_replica apply to distributed jobs only")
        return self

    @property
    def interactive(self) -> bool:
        return self.kind is JobKind.JUPYTER

    @property
    def world_size(self) -> int:
        return self.replicas * self.procs_per_replica

    def total_gpus(self) -> int:
        return self.resources.gpu * self.replicas


class SpecError(ValueError):
    """A spec that cannot be accepted; ``errors`` name each field and its reason."""

    def __init__(self, errors: list[dict[str, str]]):
        self.errors = errors
        super().__init__("; ".join(f"{e['field']}: {e['reason']}" for e in errors))


def spec_errors(exc: ValidationError) -> list[dict[str, str]]:
    return [{"field": ".".join(str(p) for p in e["loc"]) or "spec", "reason": e["msg"]} for e in exc.errors()]


def parse_spec(data: dict[str, Any]) -> JobSpec:
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(spec_errors(exc)) from None


def load_spec_yaml(text: str) -> JobSpec:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError([{"field": "spec", "reason": f"not valid YAML: {exc}"}]) from None
    if not isinstance(data, dict):
        raise SpecError([{"field": "spec", "reason": "expected a mapping"}])
    return parse_spec(data)
