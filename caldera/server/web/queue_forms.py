"""The queue form: one row per quota (resource, guarantee, deserved, capability) and the per-user caps, turned into
the body `PUT /api/v1/queues/{name}` takes, so the API's validation decides."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

from caldera.server.web.form_values import number

Short = Annotated[str, Field(max_length=32)]
CAPS = ("max_gpus", "max_interactive_jobs", "max_running_jobs")
LIMITS = ("guarantee", "deserved", "capability")
BLANK_ROWS = 2


class QueueForm(BaseModel):
    name: str = Field("", max_length=64)
    account: str = Field("", max_length=64)
    weight: str = Field("1", max_length=16)
    max_gpus: str = Field("", max_length=16)
    max_interactive_jobs: str = Field("", max_length=16)
    max_running_jobs: str = Field("", max_length=16)
    key: list[Short] = Field(default_factory=list, max_length=32)
    guarantee: list[Short] = Field(default_factory=list, max_length=32)
    deserved: list[Short] = Field(default_factory=list, max_length=32)
    capability: list[Short] = Field(default_factory=list, max_length=32)

    def rows(self) -> list[dict[str, str]]:
        n = max(len(self.key), len(self.guarantee), len(self.deserved), len(self.capability))
        cols = {c: getattr(self, c) + [""] * (n - len(getattr(self, c))) for c in ("key", *LIMITS)}
        filled = [{c: cols[c][i] for c in cols} for i in range(n) if any(cols[c][i].strip() for c in cols)]
        return filled + [dict.fromkeys(("key", *LIMITS), "") for _ in range(BLANK_ROWS)]


def _num(x: float | None) -> str:
    return "" if x is None else f"{x:g}"


def form_of(cfg: dict) -> QueueForm:
    """A queue's stored configuration (QueueConfig as JSON) as the form shows it."""
    quotas = cfg.get("quotas", {})
    caps = cfg.get("user_caps", {})
    return QueueForm(
        name=cfg.get("name", ""),
        account=cfg.get("account", ""),
        weight=_num(cfg.get("weight", 1.0)),
        **{c: _num(caps.get(c)) for c in CAPS},
        key=list(quotas),
        **{lim: [_num(q.get(lim)) for q in quotas.values()] for lim in LIMITS},
    )


def body_of(form: QueueForm) -> tuple[dict, list[dict[str, str]]]:
    quotas: dict[str, dict[str, str]] = {}
    errors = []
    for row in form.rows():
        key = row["key"].strip()
        values = {lim: number(row[lim]) for lim in LIMITS if row[lim].strip()}
        if not key:
            if values:
                errors.append({"field": "quotas", "reason": "a quota row without a resource"})
            continue
        if key in quotas:
            errors.append({"field": f"quotas.{key}", "reason": f"{key} appears twice"})
        quotas[key] = values
    caps = {c: number(getattr(form, c)) for c in CAPS if getattr(form, c).strip()}
    body = {"account": form.account, "weight": number(form.weight or "1"), "quotas": quotas, "user_caps": caps}
    return body, errors


def by_field(errors: list[dict[str, str]]) -> dict[str, list[str]]:
    """quotas.gpu/a100.guarantee -> quotas.gpu/a100 (its row), user_caps.max_gpus -> max_gpus; the rest by name."""
    out: dict[str, list[str]] = {}
    for e in errors:
        parts = e["field"].split(".")
        if parts[0] == "quotas" and len(parts) > 1:
            name = f"quotas.{parts[1]}"
        elif parts[0] == "user_caps" and len(parts) > 1:
            name = parts[1]
        elif parts[0] in ("name", "account", "weight", "quotas"):
            name = parts[0]
        else:
            name = ""
        out.setdefault(name, []).append(e["reason"])
    return out
