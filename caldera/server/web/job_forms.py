"""The new-job forms: the form's fields become the API's job body, and the API's errors go back next to a field."""

from __future__ import annotations

import shlex
from typing import Any

from pydantic import BaseModel, Field

from caldera.core.spec import JobKind
from caldera.core.tenancy import PriorityClass
from caldera.server.errors import field_error
from caldera.server.web.form_values import number
from caldera.server.web.overview import QueueChoice

KINDS = [k.value for k in JobKind]
PRIORITIES = [p.value for p in PriorityClass]


class JobForm(BaseModel):
    """As typed: strings, so that every mistake is reported by the API's validation, not by the form's."""

    name: str = Field("", max_length=128)
    command: str = Field("", max_length=8192)
    queue: str = Field("", max_length=64)
    priority: str = Field("normal", max_length=16)
    gpu: str = Field("0", max_length=8)
    gpu_model: str = Field("", max_length=64)
    cpu: str = Field("1", max_length=16)
    memory_mib: str = Field("1024", max_length=16)
    max_runtime_s: str = Field("", max_length=16)
    replicas: str = Field("1", max_length=8)
    procs_per_replica: str = Field("1", max_length=8)
    env: str = Field("", max_length=16384, description="KEY=VALUE lines")
    workdir: str = Field("", max_length=1024, description="inside my workspace; the job's own folder when empty")
    image: str = Field("", max_length=512, description="the platform's default image when empty")
    quiet: str = Field("", max_length=8, description="checked: no notification about this job but the portal's")


FIELDS = set(JobForm.model_fields)


def form_of(spec: dict) -> JobForm:
    """A submitted job's spec as the form shows it: the start of a clone."""
    res = spec.get("resources", {})

    def text(x) -> str:
        return "" if x is None else f"{x:g}" if isinstance(x, float) else str(x)

    return JobForm(
        name=spec.get("name", ""),
        command=shlex.join(spec.get("command") or []),
        queue=spec.get("queue") or "",
        priority=spec.get("priority", "normal"),
        gpu=text(res.get("gpu", 0)),
        gpu_model=res.get("gpu_model") or "",
        cpu=text(res.get("cpu", 1.0)),
        memory_mib=text(res.get("memory_mib", 1024)),
        max_runtime_s=text(spec.get("max_runtime_s")),
        replicas=text(spec.get("replicas", 1)),
        procs_per_replica=text(spec.get("procs_per_replica", 1)),
        env="\n".join(f"{k}={v}" for k, v in spec.get("env", {}).items()),
        image=spec.get("image") or "",
        workdir=spec.get("workdir") or "",
        quiet="on" if spec.get("notify") is False else "",
    )


def _env(text: str) -> tuple[dict[str, str], dict[str, Any] | None]:
    """The variables, and the error row of the first line that is not KEY=VALUE."""
    out = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        key, eq, value = line.partition("=")
        if not eq:
            shown = repr(line.strip()[:40])
            return out, field_error("env", f"{shown}: expected KEY=VALUE", "NotKeyValue", {"line": shown})
        out[key.strip()] = value
    return out, None


def body_of(kind: str, form: JobForm, choices: list[QueueChoice]) -> tuple[dict, list[dict[str, Any]]]:
    """The API body, and the errors the API could not report itself (a line of env that is not KEY=VALUE)."""
    account = next((c.account for c in choices if c.name == form.queue), None)
    resources = {"cpu": number(form.cpu), "memory_mib": number(form.memory_mib), "gpu": number(form.gpu)}
    if form.gpu_model:
        resources["gpu_model"] = form.gpu_model
    body: dict = {"name": form.name, "kind": kind, "priority": form.priority, "resources": resources}
    pairs = (
        ("command", form.command.strip()),
        ("queue", form.queue),
        ("account", account),
        ("image", form.image),
        ("workdir", form.workdir.strip()),
    )
    for key, value in pairs:
        if value:
            body[key] = value
    if form.quiet:
        body["notify"] = False  # the portal's list still shows it; my settings choose the rest otherwise
    if form.max_runtime_s.strip():
        body["max_runtime_s"] = number(form.max_runtime_s.strip())
    if kind == JobKind.DISTRIBUTED.value:
        body["replicas"] = number(form.replicas.strip())
        body["procs_per_replica"] = number(form.procs_per_replica.strip())
    env, error = _env(form.env)
    if error is not None:
        return body, [error]
    body["env"] = env
    return body, []


def by_field(errors: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """API errors keyed by the form field they belong to ("resources.gpu" -> gpu); the rest under "" (the form).
    Whole rows: the page renders each reason from its code in the reader's language."""
    out: dict[str, list[dict[str, Any]]] = {}
    for e in errors:
        parts = e["field"].split(".")
        name = next((x for x in reversed(parts) if x in FIELDS), None)
        if name is None:
            name = {"resources": "gpu", "account": "queue"}.get(parts[0], "")
        out.setdefault(name, []).append(e)
    return out
