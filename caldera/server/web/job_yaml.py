"""A job as YAML in the CLI's format (`caldera submit job.yaml`): what the form exports and imports, and what a
job page offers for download. Parsing is the core's ``load_spec_yaml``; the API validates what is submitted."""

from __future__ import annotations

import shlex

import yaml

from caldera.core.spec import MAX_SPEC_YAML_CHARS, JobSpec, load_spec_yaml
from caldera.db.models import Job

MAX_YAML_CHARS = MAX_SPEC_YAML_CHARS  # the form field's limit is the parser's


def body_of_job(job: Job) -> dict:
    """The body that submits the same job again: its spec, in the account and queue it actually ran in."""
    return {**job.spec, "account": job.account, "queue": job.queue}


def dump(body: dict) -> str:
    """Readable YAML: fields left at nothing are dropped and the command is one shell string (shlex splits it back
    to the same argv)."""
    out = {k: v for k, v in body.items() if v not in (None, {}, [])}
    if isinstance(out.get("command"), list):
        out["command"] = shlex.join(out["command"])
    if isinstance(out.get("resources"), dict):
        out["resources"] = {k: v for k, v in out["resources"].items() if v is not None}
    return yaml.safe_dump(out, sort_keys=False, allow_unicode=True)


def load(text: str) -> JobSpec:
    """Parsed and checked as `caldera submit` and the API would: a SpecError names each bad field."""
    return load_spec_yaml(text)
