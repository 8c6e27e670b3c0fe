"""The runtime chosen when nobody chose one (the setting ``runtime`` is ``auto``): decided here, above the settings
and beside the runtime registry, so that ``caldera.config`` imports nothing of the runtimes."""

from __future__ import annotations

from caldera.config import AUTO_RUNTIME, Settings


def resolved(settings: Settings) -> Settings:
    """``settings`` with ``runtime`` named: an admin's choice as it is, ``auto`` as :func:`default_name` decides."""
    if settings.runtime != AUTO_RUNTIME:
        return settings
    return settings.model_copy(update={"runtime": default_name()})


def default_name() -> str:
    """``container`` where podman can run jobs (root, podman working, the default image present), else ``local``:
    what ``auto`` means."""
    return default_choice()[0]


def default_choice() -> tuple[str, str]:
    """The runtime chosen when nobody chose one, and why (``caldera up`` says it)."""
    from caldera.runtime.container import probe  # podman is looked at only when a default is needed

    if not probe.usable():
        return "local", probe.problem() or ""
    return "container", probe.describe()
