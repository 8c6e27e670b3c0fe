"""The Kubernetes runtime's own settings, from CALDERA_KUBERNETES_* variables (e.g. CALDERA_KUBERNETES_KUBECONFIG)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from caldera.runtime.container.settings import DEFAULT_IMAGE


class KubernetesSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CALDERA_KUBERNETES_", extra="ignore")

    kubeconfig: Path | None = Field(None, description="a kubeconfig file; in-cluster config when empty")
    context: str | None = Field(None, max_length=253, description="kubeconfig context; its current one when empty")
    image: str = Field(DEFAULT_IMAGE, max_length=256, description="the image of jobs whose spec names none")
    gpu_resource: str = Field("nvidia.com/gpu", description="the extended resource GPUs are counted in")
    gpu_model_label: str = Field("nvidia.com/gpu.product", description="node label holding the GPU model")
    master_port: int = Field(29500, ge=1, le=65535, description="rank 0's port of distributed jobs")
    lab_port: int = Field(8888, ge=1, le=65535, description="the port Jupyter Lab or code-server listens on in its pod")
    platform_cidr: str | None = Field(
        None, max_length=64, description="addresses the platform's proxy connects from; the lab's only callers"
    )
    platform_namespace: str | None = Field(None, max_length=63, description="or: the namespace the platform runs in")
    storage_claim: str | None = Field(
        None,
        max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="a PersistentVolumeClaim, in every account's namespace, that mounts the storage dir's root: each "
        "storage mount is a subPath of it; hostPath volumes of the storage dir (the same path on every node) if empty",
    )
    finished_job_ttl_s: int = Field(
        300,
        ge=0,
        description="a finished Job (and with it its pods, Workload and every object of the attempt) is deleted "
        "this long after it ended; the platform keeps its logs",
    )
    eviction_backoff_s: float = Field(
        30.0,
        ge=0,
        description="a job Kueue evicted because its pods were not all ready in time (no node fits them) goes to "
        "Kueue again after this long, doubled with each eviction in a row (at most 1 h)",
    )
    evictions_before_hold: int = Field(
        5,
        ge=1,
        description="after this many such evictions in a row the job is held (why: HeldNoNodeFits, with "
        "kube-scheduler's message) until the cluster's nodes change",
    )
    watch_timeout_s: int = Field(300, ge=10, description="a watch is renewed (resourceVersion kept) after this")
    request_timeout_s: float = Field(30.0, gt=0, description="longest wait for one API request")
    manage_queues: bool = Field(
        True, description="push Caldera's queues to Kueue whenever they change (off: the site manages Kueue itself)"
    )
    cohort_per: Literal["account", "cluster"] = Field(
        "cluster", description="Kueue cohorts: one for the cluster (queues borrow the unguaranteed rest) or per account"
    )
