"""The runtime chosen when nobody chose one (the setting ``runtime``'s default): a module of its own below both
``caldera.config`` and ``caldera.runtime.registry``, so that neither imports the other."""

from __future__ import annotations


def default_name() -> str:
    """``container`` where podman can run jobs (root, podman working, the default image present), else ``local``:
    the setting ``runtime`` when nobody chose one."""
    return default_choice()[0]


def default_choice() -> tuple[str, str]:
    """The runtime chosen when nobody chose one, and why (``caldera up`` says it)."""
    from caldera.runtime.container import probe  # podman is looked at only when a default is needed

    if not probe.usable():
        return "local", probe.problem() or ""
    return "container", probe.describe()
