"""Resource requests and the keys quotas are expressed in.

Quotas and usage are flat vectors keyed by resource name: ``cpu`` (cores), ``memory`` (MiB), ``gpu`` (any model)
and ``gpu/<model>`` (one GPU model, lower case, e.g. ``gpu/a100``).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

CPU = "cpu"
MEMORY = "memory"
GPU = "gpu"


def gpu_key(model: str) -> str:
    return f"{GPU}/{model.lower()}"


def is_resource_key(key: str) -> bool:
    return key in (CPU, MEMORY, GPU) or (key.startswith(GPU + "/") and len(key) > len(GPU) + 1)


class Resources(BaseModel):
    """What one replica asks for."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpu: float = Field(1.0, ge=0, description="CPU cores")
    memory_mib: int = Field(1024, ge=0, description="memory in MiB")
    gpu: int = Field(0, ge=0, description="whole GPUs")
    gpu_model: str | None = Field(None, description="GPU model such as a100; any model when empty")
    gpu_memory_mib: int | None = Field(None, ge=1, description="GPU memory needed, for GPU sharing")

    @field_validator("gpu_model")
    @classmethod
    def _lower(cls, v: str | None) -> str | None:
        return v.lower() if v else None

    def vector(self, replicas: int = 1) -> dict[str, float]:
        """The quota vector this request consumes, over ``replicas`` replicas."""
        v: dict[str, float] = {CPU: self.cpu * replicas, MEMORY: float(self.memory_mib * replicas)}
        if self.gpu:
            v[GPU] = float(self.gpu * replicas)
            if self.gpu_model:
                v[gpu_key(self.gpu_model)] = float(self.gpu * replicas)
        return v


def add_vectors(a: dict[str, float], b: dict[str, float], sign: float = 1.0) -> dict[str, float]:
    out = dict(a)
    for k, x in b.items():
        out[k] = out.get(k, 0.0) + sign * x
    return out
