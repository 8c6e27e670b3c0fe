"""Settings, from environment variables prefixed CALDERA_ (nested with __) or a TOML/JSON-free plain env file."""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

AUTO_RUNTIME = "auto"  # the setting ``runtime`` when nobody chose one


class FakeGpu(BaseModel):
    """A GPU an admin declares on a host without one, so everything can be tested on CPU."""

    model: str = "fake"
    memory_mib: int = 16384


def _default_data_dir() -> Path:
    """~/.caldera"""
    return Path(os.path.expanduser("~/.caldera"))


def _default_traces_dir() -> Path:
    """../shared/data/traces (beside the repository checkout)"""
    return Path(__file__).resolve().parents[2] / "shared" / "data" / "traces"


def _default_shared_data_dir() -> Path:
    """../shared/data (beside the repository checkout)"""
    return Path(__file__).resolve().parents[2] / "shared" / "data"


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def lab_job_of(template: str, host: str) -> str | None:
    """The job whose lab ``host`` (a Host header: name and port) names under ``template`` (``lab_url_template``),
    or None where it names no lab."""
    pattern = re.escape(urlsplit(template).netloc.lower()).replace(re.escape("{job}"), "([0-9a-z]{1,63})")
    match = re.fullmatch(pattern, host.lower())
    return match.group(1) if match else None


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CALDERA_", env_nested_delimiter="__", extra="ignore")

    data_dir: Path = Field(default_factory=_default_data_dir, description="the database, keys, logs and workspaces")
    database_url: str | None = Field(None, description="SQLAlchemy URL; SQLite in data_dir when empty")
    host: str = Field("127.0.0.1", description="address the platform and lab origins bind")
    port: int = Field(8642, description="port of the platform's pages and API")
    public_url: str | None = Field(None, description="the URL browsers reach the platform at; host:port if empty")
    fake_gpus: list[FakeGpu] = Field(default_factory=list, description="used when NVML finds no GPU")
    node_name: str | None = Field(None, description="this host's node name; its hostname when empty")
    node_cpu: float | None = Field(None, description="CPUs jobs may be given; all of this host's when empty")
    node_memory_mib: int | None = Field(None, description="memory jobs may be given; all of this host's when empty")
    cancel_grace_s: float = Field(10.0, description="SIGTERM to SIGKILL on cancel")
    max_array_size: int = Field(
        1000, ge=1, le=100_000, description="tasks one job array may have (caldera submit --array); each is a job"
    )
    preempt_grace_s: float = Field(30.0, description="SIGTERM (and the notice) to SIGKILL on preemption")
    schedule_interval_s: float = Field(1.0, description="seconds between scheduling cycles")
    access_token_ttl_s: int = Field(900, description="lifetime of an access token")
    refresh_token_ttl_s: int = Field(7 * 24 * 3600, description="lifetime of a refresh token (one use, rotated)")
    session_ttl_s: int = Field(12 * 3600, description="lifetime of a portal login")
    fair_share_half_life_s: float = Field(7 * 24 * 3600, description="half-life of past GPU usage in fair share")
    policy: str = Field("caldera", description="scheduling policy: caldera, tiresias or fifo")
    runtime: str = Field(
        AUTO_RUNTIME,
        description="which backend runs jobs: an entry point of caldera.runtimes; auto: container where podman and its "
        "base image are usable, else local (chosen when the platform starts: caldera.runtime.default)",
    )
    initial_admin_password: str | None = Field(None, description="first admin's password; generated when empty")
    traces_dir: Path = Field(default_factory=_default_traces_dir, description="job traces for caldera sim")
    shared_data_dir: Path = Field(default_factory=_default_shared_data_dir, description="public reference data")
    interference_model: Path | None = Field(None, description="decay model file; <data_dir>/interference.model")
    # GPU sharing (README "GPU sharing"): shareable jobs join occupied GPUs where the model predicts it pays
    gpu_sharing: bool = Field(True, description="wrap the policy with interference-aware sharing")
    sharing_default_tolerance: float = Field(0.3, gt=0, le=1, description="slowdown accepted unless job/queue say")
    sharing_max_jobs_per_gpu: int = Field(2, ge=2, le=8, description="jobs on one shared GPU at most")
    sharing_prefer_gain: float | None = Field(
        None, gt=0, description="a shareable job joins a good partner instead of a free GPU above this gain"
    )
    # measured in the sharing simulator (README "GPU sharing"), not yet in a live cluster: off unless asked for
    sharing_drain_for_blocked: bool = Field(False, description="no new partner on the GPUs a blocked gang needs")
    sharing_pair_on_free: bool = Field(False, description="with drain: free GPUs open to a pair of waiting jobs")
    sharing_match_window: int = Field(1, ge=1, le=10_000, description="waiting jobs placed best pair first")
    sharing_profile_s: float = Field(
        300.0, ge=0, le=86_400, description="a shareable job's first seconds alone, measured as its solo record; 0: off"
    )
    isolate_distributed_network: bool = Field(
        True, description="ranks of a distributed job on this host share a private network namespace"
    )
    # "owner": every job runs as its owner's unprivileged OS uid (needs a root server). "server": jobs run as the
    # server's own user, isolated from nothing -- an admin must choose it explicitly
    run_jobs_as: Literal["owner", "server"] = Field(
        "owner", description="owner: each job as its owner's uid (root server); server: the server's user"
    )
    job_uid_min: int = Field(200_000, ge=1000, description="uids created for platform users come from this range")
    job_uid_max: int = Field(299_999, ge=1000, description="the last uid of that range")
    os_user_prefix: str = Field("cal-", description="OS accounts created for platform users: <prefix><username>")
    ssh_server: Literal["auto", "asyncssh"] = Field(
        "auto", description="caldera ssh's server in a job: auto, OpenSSH's sshd -i where the job has it; asyncssh"
    )
    workspaces_dir: Path | None = Field(None, description="users' own files; <data_dir>/workspaces when empty")
    # every lab lives on an origin of its own (README "Security model"), so a notebook's JavaScript runs neither
    # where the platform's cookie is valid nor where another lab's is: one host per job, under a wildcard name
    lab_port: int | None = Field(None, description="port the labs' server listens on; port + 1 when empty")
    lab_public_url: str | None = Field(
        None, description="each lab's URL, {job} its host's first label, e.g. https://{job}.lab.example.edu"
    )
    lab_cookie_ttl_s: int = Field(2 * 3600, description="lifetime of a lab's cookie in the browser")
    code_server: Path = Field(
        Path("/var/cache/caldera-code-server/node_modules/.bin/code-server"),
        description="the code-server the process runtime runs for vscode jobs (scripts/install-code-server)",
    )
    # API hardening (README "API security")
    max_body_bytes: int = Field(1024 * 1024, ge=1024, description="larger request bodies get 413")
    login_max_failures_per_user: int = Field(5, ge=1, description="failed logins of one name per window, then 429")
    login_max_failures_per_address: int = Field(20, ge=1, description="failed logins from one address per window")
    login_window_s: float = Field(300.0, gt=0, description="the window failed logins are counted over")
    trusted_proxies: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="reverse proxies (addresses or CIDRs, comma-separated) whose X-Forwarded-For names the client; "
        "none: the header is ignored and the client is the connection's address",
    )

    # images (README "Images"): the platform's docker-registry on 127.0.0.1:registry_port unless a URL is given
    registry_url: str | None = Field(None, max_length=256, description="an OCI registry, e.g. http://reg:5000")
    registry_port: int = Field(8650, ge=1, le=65535, description="port of the registry `caldera up` starts")
    registry_credentials: Path | None = Field(
        None, description="the platform's registry login (0600); <data_dir>/registry/credentials.json when empty"
    )
    image_quota_mib: int = Field(20480, ge=0, description="each user's image quota unless an admin set another")
    image_build_cpus: float = Field(2.0, gt=0, description="CPUs one image build may use")
    image_build_memory_mib: int = Field(4096, ge=256, description="memory one image build may use")
    image_build_timeout_s: float = Field(3600.0, gt=0, description="a build running longer fails")
    snapshot_max_mib: int = Field(10240, ge=1, description="a session snapshot larger than this is refused")
    # storage spaces (docs/storage.md): backends are entry points of caldera.storage_backends
    storage_backend: str = Field("local", description="where spaces live: an entry point of caldera.storage_backends")
    storage_dir: Path | None = Field(
        None, description="account and public spaces (a shared file system on a cluster); <data_dir>/spaces if empty"
    )
    storage_quota_bytes: int = Field(100 * 2**30, ge=0, description="a space's size quota unless an admin set one")
    storage_quota_files: int = Field(1_000_000, ge=0, description="a space's file-count quota unless an admin set one")
    storage_max_upload_bytes: int = Field(2**40, ge=1, description="the largest file one upload may bring")
    storage_chunk_bytes: int = Field(
        64 * 2**20, ge=1024, description="the largest chunk of a resumable upload (one request body)"
    )
    storage_reconcile_s: float = Field(
        3600.0, gt=0, description="each space's usage counters are checked by a walk this often"
    )
    storage_import_allowed_networks: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="non-public networks an import from URL may reach (all public ones may)"
    )
    huggingface_mirror_url: str = Field(
        "",
        max_length=2048,
        description="base URL of a Hugging Face-style mirror (its /api and /resolve paths) that hf:// imports list and "
        "download from; hf:// imports are refused when empty",
    )
    catalogue_max_entries: int = Field(
        200, ge=0, description="dataset and model versions one user may have in the catalogue"
    )
    catalogue_quota_bytes: int = Field(
        100 * 2**30, ge=0, description="bytes of the catalogue's copies one user's versions may take, together"
    )
    catalogue_copy_bytes_per_s: int = Field(
        0, ge=0, description="the most bytes per second one publish copies, leaving the disks to jobs; no limit when 0"
    )
    # notifications (docs/governance.md): channels are entry points of caldera.notifiers
    smtp_host: str | None = Field(None, max_length=256, description="SMTP server for e-mail; no e-mail when empty")
    smtp_port: int = Field(25, ge=1, le=65535, description="port of the SMTP server")
    smtp_from: str = Field("caldera@localhost", max_length=254, description="sender address of notifications")
    smtp_starttls: bool = Field(False, description="upgrade the SMTP connection with STARTTLS")
    smtp_username: str | None = Field(None, max_length=256, description="SMTP login; none when empty")
    smtp_password: str | None = Field(None, max_length=256, description="SMTP password")
    notify_timeout_s: float = Field(10.0, gt=0, description="one delivery attempt (SMTP, webhook) gives up after this")
    notify_max_attempts: int = Field(8, ge=1, description="deliveries tried this often, then marked failed")
    notify_retry_base_s: float = Field(30.0, gt=0, description="first retry delay; doubles each attempt (max 1 h)")
    webhook_allowed_networks: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="non-public networks webhooks may reach (all public ones may)"
    )
    notify_wait_threshold_s: float = Field(
        600.0, ge=0, description="a job that waited longer than this tells its user when it starts"
    )

    # observability (docs/metrics.md): the node agent and the Prometheus it feeds
    metrics_source: str = Field(
        default_factory=lambda data: "fake" if data.get("fake_gpus") else "nvml",
        description="where GPU metrics come from: an entry point of caldera.metric_sources; fake where fake_gpus "
        "are declared, else nvml",
    )
    metrics_dcgm_url: str | None = Field(
        None, max_length=256, description="a DCGM exporter's /metrics the dcgm metric source reads GPUs from"
    )
    metrics_interval_s: float = Field(5.0, ge=0.5, le=3600, description="seconds between the agent's samples")
    metrics_port: int = Field(8651, ge=1, le=65535, description="port the agent exposes its series on (127.0.0.1)")
    prometheus_url: str | None = Field(
        None, max_length=256, description="a site's own Prometheus; the one `caldera up` starts when empty"
    )
    prometheus_port: int = Field(8652, ge=1, le=65535, description="port of the Prometheus `caldera up` starts")
    metrics_retention_days: int = Field(90, ge=1, le=3650, description="days Prometheus keeps the series")
    prometheus_timeout_s: float = Field(2.0, gt=0, le=60, description="a query to Prometheus longer than this fails")
    metrics_rule_interval_s: float = Field(
        60.0, ge=1, le=3600, description="seconds between evaluations of the recording rules long charts read"
    )

    # governance (docs/governance.md): idle GPUs and runtime limits; the rules themselves are per queue
    governance_interval_s: float = Field(60.0, gt=0, le=3600, description="seconds between governance checks")
    idle_max_gap_s: float = Field(
        60.0, gt=0, description="GPU samples further apart than this are a gap: no idle action over a gap"
    )
    idle_snapshot_timeout_s: float = Field(
        1800.0, gt=0, description="an idle Jupyter session is stopped after this even if its snapshot is not done"
    )
    runtime_limit_warning_s: float = Field(
        86400.0, ge=0, description="a job is warned this long before its queue's runtime limit stops it"
    )

    @field_validator("trusted_proxies", "webhook_allowed_networks", "storage_import_allowed_networks", mode="before")
    @classmethod
    def _networks(cls, value: object) -> list[str]:
        """Each an address or a network; a wildcard is refused: trusting everyone is trusting no limit."""
        items = value.replace(",", " ").split() if isinstance(value, str) else value
        return [str(ipaddress.ip_network(item, strict=False)) for item in items]  # type: ignore[union-attr]

    @field_validator("huggingface_mirror_url")
    @classmethod
    def _mirror_url(cls, value: str) -> str:
        """An http(s) URL of a host (a path prefix allowed), no credentials, query or fragment; kept without a
        trailing slash, as the paths below it are appended."""
        if not value:
            return value
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
            raise ValueError("CALDERA_HUGGINGFACE_MIRROR_URL must be an http(s) URL of a host, without ?query or #")
        if parts.username is not None or parts.password is not None:
            raise ValueError("CALDERA_HUGGINGFACE_MIRROR_URL must not hold credentials")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _lab_url_names_the_job(self) -> Settings:
        parts = urlsplit(self.lab_url_template)
        if parts.scheme not in ("http", "https") or parts.path.strip("/") or parts.query or parts.fragment:
            raise ValueError("CALDERA_LAB_PUBLIC_URL must be an http(s) URL without a path")
        if not parts.netloc.startswith("{job}.") or self.lab_url_template.count("{job}") != 1:
            raise ValueError("CALDERA_LAB_PUBLIC_URL must name each lab's host as {job}.<domain>")
        return self

    @model_validator(mode="after")
    def _pairing_needs_drain(self) -> Settings:
        # pairing opens only the free GPUs outside the drained set: without a drain it would be silently ignored
        if self.sharing_pair_on_free and not self.sharing_drain_for_blocked:
            raise ValueError("CALDERA_SHARING_PAIR_ON_FREE needs CALDERA_SHARING_DRAIN_FOR_BLOCKED=true")
        return self

    @property
    def sqlite_path(self) -> Path:
        return self.data_dir / "caldera.db"

    @property
    def db_url(self) -> str:
        return self.database_url or f"sqlite:///{self.sqlite_path}"

    @property
    def profiles_dir(self) -> Path:
        """The platform's own solo records (``solo.csv``), measured from shareable jobs' first minutes."""
        return self.data_dir / "profiles"

    @property
    def runs_dir(self) -> Path:
        return self.data_dir / "runs"

    @property
    def url(self) -> str:
        return self.public_url or f"http://{self.host}:{self.port}"

    @property
    def workspaces(self) -> Path:
        return self.workspaces_dir or self.data_dir / "workspaces"

    @property
    def spaces_dir(self) -> Path:
        return self.storage_dir or self.data_dir / "spaces"

    @property
    def scratch_dir(self) -> Path:
        """Per-attempt directories a job may read (preemption notice, the lab's socket), one owner each."""
        return self.data_dir / "scratch"

    @property
    def lab_bind_port(self) -> int:
        return self.lab_port or self.port + 1

    @property
    def lab_url_template(self) -> str:
        """Each lab's origin, ``{job}`` standing for its job's id; on this host's loopback ``*.localhost``, which
        browsers resolve themselves."""
        if self.lab_public_url:
            return self.lab_public_url.rstrip("/")
        domain = "lab.localhost" if self.host == "localhost" or _is_address(self.host) else f"lab.{self.host}"
        return f"http://{{job}}.{domain}:{self.lab_bind_port}"

    def lab_url(self, job_id: str) -> str:
        """The origin of this job's lab."""
        return self.lab_url_template.replace("{job}", job_id)
