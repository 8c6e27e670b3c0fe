"""Settings, from environment variables prefixed CALDERA_ (nested with __) or a TOML/JSON-free plain env file."""
from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class FakeGpu(BaseModel):
    """A GPU an admin declares on a host without one, so everything can be tested on CPU."""

    model: str = "fake"
    memory_mib: int = 16384


def _default_data_dir() -> Path:
    return Path(os.path.expanduser("~/.caldera"))


def _default_traces_dir() -> Path:
    # ../shared/data/traces relative to the repository checkout
    return Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CALDERA_", env_nested_delimiter="__", extra="ignore")

    data_dir: Path = Field(default_factory=_default_data_dir)
    database_url: str | None = Field(None, description="SQLAlchemy URL; SQLite in data_dir when empty")
    host: str = "127.0.0.1"
    port: int = 8642
    public_url: str | None = None
    fake_gpus: list[FakeGpu] = Field(default_factory=list, description="used when NVML finds no GPU")
    node_name: str | None = None
    node_cpu: float | None = None           # defaults to os.cpu_count()
    node_memory_mib: int | None = None      # defaults to physical memory
    cancel_grace_s: float = 10.0
    preempt_grace_s: float = 30.0
    schedule_interval_s: float = 1.0
    access_token_ttl_s: int = 900
    refresh_token_ttl_s: int = 7 * 24 * 3600
    session_ttl_s: int = 12 * 3600
    fair_share_half_life_s: float = 7 * 24 * 3600
    policy: str = "caldera"
    initial_admin_password: str | None = Field(None, description="first admin's password; generated when empty")
    traces_dir: Path = Field(default_factory=_default_traces_dir)
    isolate_distributed_network: bool = True   # ranks of a local distributed job share a private network namespace

    @property
    def sqlite_path(self) -> Path:
        return self.data_dir / "caldera.db"

    @property
    def db_url(self) -> str:
        return self.database_url or f"sqlite:///{self.sqlite_path}"

    @property
    def runs_dir(self) -> Path:
        return self.data_dir / "runs"

    @property
    def url(self) -> str:
        return self.public_url or f"http://{self.host}:{self.port}"
