"""The job spec users submit (JSON through the API or YAML through the CLI)."""

from __future__ import annotations

import posixpath
import re
import shlex
from enum import Enum
from typing import Annotated, Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from caldera.core import catalogue_names
from caldera.core.kinds import JobKind, is_interactive
from caldera.core.notify_events import NotifyEvent
from caldera.core.resources import Resources
from caldera.core.tenancy import PriorityClass

# Size limits: a spec is stored with the job and sent in every listing of its owner's jobs, and its strings reach
# execve, which refuses NUL bytes and arguments over 128 KiB
MAX_COMMAND_ARGS = 1024
MAX_COMMAND_CHARS = 65536  # all arguments together (or the shell string before it is split)
MAX_ENV_ENTRIES = 256
MAX_ENV_VALUE_CHARS = 32768
MAX_PATH_CHARS = 1024

_Arg = Annotated[str, Field(max_length=MAX_COMMAND_CHARS)]
_EnvName = Annotated[str, Field(min_length=1, max_length=256)]
_EnvValue = Annotated[str, Field(max_length=MAX_ENV_VALUE_CHARS)]
_NAME = r"^[a-z0-9][a-z0-9._-]{0,62}$"  # accounts and queues (core.tenancy)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


MAX_MOUNTS = 16
_SPACE = r"^(personal|public|(personal|account):[A-Za-z0-9][A-Za-z0-9._-]{0,63})$"  # caldera.storage.spaces
# Where a job may see a space: an allowlist, for no runtime may let a space (files its user chose) cover a path
# that something more privileged than the job reads in the job's view (root's Python, a launcher, podman's init).
# A runtime may narrow it (the process runtime: /tmp and /var/tmp only) and re-checks it at launch.
MOUNT_TOPS = ("/tmp", "/var/tmp", "/data", "/datasets", "/models", "/shared", "/mnt")


def mount_top(at: str) -> str | None:
    """The top of MOUNT_TOPS that ``at`` (absolute, normalised) is or lies below, or None."""
    return next((t for t in MOUNT_TOPS if at == t or at.startswith(t + "/")), None)


def nests(a: str, b: str) -> bool:
    """Whether path ``a`` is ``b`` or lies below it, or the other way round."""
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


_CATALOGUE_REF = catalogue_names.anchored(catalogue_names.REF)


def inside_workspace(v: str) -> str:
    """A path relative to the owner's workspace that never leaves it through ``..`` (the server confines it too)."""
    if "\0" in v:
        raise ValueError("cannot contain NUL bytes")
    if v.startswith(("/", "~")):
        raise ValueError("must be relative to your workspace, not an absolute path")
    if ".." in v.split("/") or posixpath.normpath(v).startswith(".."):
        raise ValueError("cannot contain '..': it must stay inside your workspace")
    return v


class Mount(BaseModel):
    """A storage space, or a dataset or model of the catalogue, seen by the job at ``at`` (docs/storage.md):
    read-only unless ``writable`` (a space only)."""

    model_config = ConfigDict(extra="forbid")

    space: str | None = Field(None, max_length=80, pattern=_SPACE, description="personal, account:<name> or public")
    dataset: str | None = Field(None, max_length=97, pattern=_CATALOGUE_REF, description="name or name@version")
    model: str | None = Field(None, max_length=97, pattern=_CATALOGUE_REF, description="name or name@version")
    # an allowlist: the path reaches podman's --volume (where ':' and ',' separate options) and mount(2)
    at: str = Field(
        ...,
        max_length=MAX_PATH_CHARS,
        pattern=r"^(/[A-Za-z0-9._-]+)+/?$",
        description="a path in the job: /tmp, /var/tmp, /data, /datasets, /models, /shared or /mnt, or below one",
    )
    writable: bool = Field(
        False, strict=True, description="write access: to a space you may write (yours, an account's as an rw member)"
    )

    @field_validator("at")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if ".." in v.split("/") or "." in v.split("/"):
            raise ValueError("cannot contain '.' or '..' components")
        v = v.rstrip("/")
        if mount_top(v) is None:
            raise ValueError(f"must be one of {', '.join(MOUNT_TOPS)} or lie below one")
        return v

    @model_validator(mode="after")
    def _one_source(self) -> Mount:
        if sum(x is not None for x in (self.space, self.dataset, self.model)) != 1:
            raise ValueError("a mount names one of space, dataset or model")
        if self.writable and self.space is None:
            raise ValueError("a dataset or model is mounted read-only")
        return self


MAX_DEPENDENCIES = 64


class DependencyWhen(str, Enum):
    OK = "ok"  # the dependency must succeed; if it ends otherwise, this job is cancelled
    ANY = "any"  # the dependency must end, however


class Dependency(BaseModel):
    """A job this one waits for (``caldera run --after JOB[:ok|:any]``)."""

    model_config = ConfigDict(extra="forbid")

    job: str = Field(..., min_length=1, max_length=32, pattern=r"^[A-Za-z0-9]+$", description="the job's whole id")
    when: DependencyWhen = DependencyWhen.OK


class Publish(BaseModel):
    """A folder of the job's working directory that becomes a version of a model of the catalogue once the job has
    succeeded, recording the job (docs/storage.md)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(
        ..., pattern=catalogue_names.anchored(catalogue_names.NAME), description="a model name of yours, or a new one"
    )
    version: str | None = Field(
        None, pattern=catalogue_names.anchored(catalogue_names.VERSION), description="the job's id when empty"
    )
    path: str = Field("out", max_length=MAX_PATH_CHARS, description="the folder, relative to the working directory")
    description: str = Field("", max_length=catalogue_names.MAX_DESCRIPTION_CHARS)
    visibility: str = Field("private", pattern=catalogue_names.anchored(catalogue_names.VISIBILITY))
    shared_with: list[Annotated[str, Field(pattern=catalogue_names.anchored(catalogue_names.SHARE))]] = Field(
        default_factory=list, max_length=catalogue_names.MAX_SHARES, description="user:<name> or account:<name>"
    )
    framework: str = Field("", max_length=64, pattern=catalogue_names.anchored(catalogue_names.FRAMEWORK))

    @field_validator("path")
    @classmethod
    def _inside(cls, v: str) -> str:
        return inside_workspace(v)


class JobSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(..., min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    kind: JobKind = JobKind.BATCH
    command: list[_Arg] | None = Field(
        None, max_length=MAX_COMMAND_ARGS, description="argv, or a shell string split with shlex"
    )
    env: dict[_EnvName, _EnvValue] = Field(default_factory=dict, max_length=MAX_ENV_ENTRIES)
    workdir: str | None = Field(
        None,
        max_length=MAX_PATH_CHARS,
        description="working directory, relative to your workspace; a fresh one per job when empty",
    )
    account: str | None = Field(
        None, pattern=_NAME, description="the account (project) to charge; the user's default when empty"
    )
    queue: str | None = Field(
        None, pattern=_NAME, description="queue in the account; the account's default queue when empty"
    )
    priority: PriorityClass = PriorityClass.NORMAL
    resources: Resources = Field(default_factory=Resources, description="per replica")
    replicas: int = Field(1, ge=1, le=1024, strict=True)
    procs_per_replica: int = Field(1, ge=1, le=64, strict=True)
    max_runtime_s: int | None = Field(
        None, ge=1, le=10 * 365 * 86400, strict=True, description="runtime limit; lets the job backfill"
    )
    image: str | None = Field(
        None,
        max_length=256,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]*$",
        description="container image the job runs in; the platform's default image when empty",
    )
    shareable: bool = Field(
        False, strict=True, description="may share a GPU; needs resources.gpu == 1 and gpu_memory_mib"
    )
    decay_tolerance: float | None = Field(None, gt=0, le=1, description="largest slowdown accepted when shared")
    workload: str | None = Field(
        None,
        max_length=128,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9 ._()+/-]*$",
        description="the profiled workload this job is, e.g. 'ResNet-50 (batch size 64)': what the decay model knows",
    )
    preemptible: bool = Field(
        True,
        strict=True,
        description="false: the job is not preempted for jobs with less attained service (batch jobs only)",
    )
    mounts: list[Mount] = Field(
        default_factory=list, max_length=MAX_MOUNTS, description="storage spaces to see inside the job"
    )
    after: list[Dependency] = Field(
        default_factory=list, max_length=MAX_DEPENDENCIES, description="jobs that must end (or succeed) first"
    )
    notify: bool | list[NotifyEvent] | None = Field(
        None,
        description="false: tell me about this job only in the portal; a list: only these events by e-mail/webhook",
    )
    publish: Publish | None = Field(
        None, description="a folder of the working directory published as a model version once the job succeeds"
    )

    @field_validator("command", mode="before")
    @classmethod
    def _split(cls, v: Any) -> Any:
        if isinstance(v, str):
            if len(v) > MAX_COMMAND_CHARS:
                raise ValueError(f"at most {MAX_COMMAND_CHARS} characters")
            try:
                return shlex.split(v)
            except ValueError as exc:  # an unclosed quote
                raise ValueError(f"cannot split the command: {exc}") from None
        return v

    @field_validator("command")
    @classmethod
    def _command_size(cls, v: list[str] | None, info: ValidationInfo) -> list[str] | None:
        if v is not None:
            kind = info.data.get("kind")
            if isinstance(kind, JobKind) and kind.interactive:
                raise ValueError(f"does not apply to {kind.value} jobs: the platform runs the session's server")
            if sum(len(a) for a in v) > MAX_COMMAND_CHARS:
                raise ValueError(f"at most {MAX_COMMAND_CHARS} characters in all arguments together")
            if any("\0" in a for a in v):
                raise ValueError("arguments cannot contain NUL bytes")
        return v

    @field_validator("env")
    @classmethod
    def _env_entries(cls, v: dict[str, str]) -> dict[str, str]:
        """A name is a shell identifier of ASCII letters, digits and ``_``; a value may hold anything but NUL
        (newlines, quotes and ``=`` reach the job as they are)."""
        for k, value in v.items():
            if not _ENV_NAME.fullmatch(k):
                raise ValueError(
                    f"invalid environment variable name {k[:64]!r}: use ASCII letters, digits and _, "
                    "not starting with a digit"
                )
            if "\0" in value:
                raise ValueError(f"the value of {k} contains a NUL byte, which no environment can hold")
        return v

    @field_validator("workdir")
    @classmethod
    def _relative(cls, v: str | None) -> str | None:
        """A path inside the owner's workspace: relative, never through ``..`` (the loop confines it too)."""
        return v if v is None else inside_workspace(v)

    @field_validator("resources", mode="before")
    @classmethod
    def _no_booleans(cls, v: Any) -> Any:
        """``gpu: true`` is not one GPU: a count must be written as a number."""
        if isinstance(v, dict):
            for k, x in v.items():
                if isinstance(x, bool):
                    raise ValueError(f"{k}: a number is expected, not {str(x).lower()}")
            if isinstance(v.get("gpu_model"), str) and len(v["gpu_model"]) > 64:
                raise ValueError("gpu_model: at most 64 characters")
        return v

    @model_validator(mode="after")
    def _kind_rules(self) -> JobSpec:
        if not self.kind.interactive and not self.command:
            raise ValueError(f"a {self.kind.value} job needs a command")
        if self.kind is not JobKind.DISTRIBUTED and (self.replicas != 1 or self.procs_per_replica != 1):
            raise ValueError("replicas and procs_per_replica apply to distributed jobs only")
        ats = [m.at for m in self.mounts]
        if any(nests(a, b) for i, a in enumerate(ats) for b in ats[:i]):
            raise ValueError("two mounts at the same path, or one inside another")
        if self.publish is not None and self.kind.interactive:
            raise ValueError(
                f"publish applies to batch and distributed jobs: a {self.kind.value} session has no end that says "
                "its output is ready (publish its folder from the portal's Files page)"
            )
        if self.shareable and (self.resources.gpu != 1 or self.resources.gpu_memory_mib is None or self.replicas != 1):
            raise ValueError("a shareable job asks for one GPU (resources.gpu: 1) and its resources.gpu_memory_mib")
        return self

    @property
    def interactive(self) -> bool:
        return is_interactive(self.kind.value)

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
    """One entry per problem; a path part (e.g. a map's key) is cut to 64 characters, so no error echoes a huge
    input back."""
    return [{"field": field_path(e["loc"]) or "spec", "reason": e["msg"]} for e in exc.errors()]


def field_path(loc: tuple[int | str, ...]) -> str:
    parts = [str(p) for p in loc]
    return ".".join(p if len(p) <= 64 else p[:61] + "..." for p in parts)


def parse_spec(data: dict[str, Any]) -> JobSpec:
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(spec_errors(exc)) from None


MAX_SPEC_YAML_CHARS = 131072  # a spec's command and env are far below this (their own limits above)
MAX_SPEC_YAML_DEPTH = 32  # a spec nests three levels (resources, env); PyYAML composes one Python frame per level


class _SpecYamlLoader(yaml.SafeLoader):
    """The safe loader, refusing what no job spec needs and what would cost the server: nesting past
    ``MAX_SPEC_YAML_DEPTH`` (a deeply nested document was a RecursionError, a 500) and aliases (a few anchored lines
    expand to a tree of billions of nodes once validated)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not accepted", event.start_mark)
        if self.depth >= MAX_SPEC_YAML_DEPTH:
            raise yaml.composer.ComposerError(
                None, None, f"nested deeper than {MAX_SPEC_YAML_DEPTH} levels", event.start_mark
            )
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def load_spec_yaml(text: str) -> JobSpec:
    """A job file as `caldera submit` and the portal's "Import YAML" read it, bounded in size and depth."""
    if len(text) > MAX_SPEC_YAML_CHARS:
        raise SpecError([{"field": "spec", "reason": f"at most {MAX_SPEC_YAML_CHARS} characters of YAML"}])
    try:
        data = yaml.load(text, Loader=_SpecYamlLoader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as exc:
        raise SpecError([{"field": "spec", "reason": f"not valid YAML: {exc}"}]) from None
    if not isinstance(data, dict):
        raise SpecError([{"field": "spec", "reason": "expected a mapping"}])
    return parse_spec(data)
