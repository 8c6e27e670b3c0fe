"""Every setting a user meets, from the settings models themselves: ``caldera settings`` prints it and
docs/settings.md holds it (a test keeps the two equal, so the docs cannot fall behind the code)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

# read by the CLI from its environment, not by the server
CLIENT_VARIABLES = (
    ("CALDERA_URL", "", "the platform's URL for the CLI and SDK; the one `caldera login` stored when empty"),
    ("CALDERA_TOKEN", "", "an API token for the CLI and SDK; the one `caldera login` stored when empty"),
    (
        "CALDERA_CONFIG_DIR",
        "$XDG_CONFIG_HOME/caldera or ~/.config/caldera",
        "where the CLI keeps its credentials (0600): a second CLI user on one account sets another",
    ),
)


def _models() -> list[tuple[str, type[BaseSettings]]]:
    from caldera.config import Settings
    from caldera.runtime.container.settings import ContainerSettings
    from caldera.runtime.kubernetes.settings import KubernetesSettings

    return [
        ("the platform", Settings),
        ("the container runtime", ContainerSettings),
        ("Kubernetes", KubernetesSettings),
    ]


def _default(field: FieldInfo) -> str:
    factory = field.default_factory
    if factory is not None:  # our factories say what they give in their docstring's first line
        return "" if factory in (list, dict) or not factory.__doc__ else factory.__doc__.strip().splitlines()[0]
    value: Any = field.default
    if value is None:
        return ""
    if isinstance(value, Path):
        return str(value)
    return json.dumps(value) if isinstance(value, list | dict) else str(value)


def rows() -> list[tuple[str, str, str, str]]:
    """(section, variable, default, description) of every setting."""
    out = []
    for section, model in _models():
        prefix = model.model_config.get("env_prefix", "")
        for name, field in model.model_fields.items():
            out.append((section, f"{prefix}{name}".upper(), _default(field), field.description or ""))
    out += [("the CLI", var, default, text) for var, default, text in CLIENT_VARIABLES]
    return out


def markdown() -> str:
    lines = ["| setting | default | what it is |", "|---|---|---|"]
    section = None
    for sec, var, default, text in rows():
        if sec != section:
            lines.append(f"| **{sec}** | | |")
            section = sec
        shown = f"`{default}`" if default else ""
        lines.append(f"| `{var}` | {shown} | {text.replace('|', '/')} |")
    return "\n".join(lines) + "\n"
