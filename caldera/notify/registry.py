"""Notifiers by channel name, registered as entry points of ``caldera.notifiers`` like runtimes are: a site's
own channel (a chat bot) is a package that declares one. The portal's list needs no notifier: it is the table."""

from __future__ import annotations

from importlib.metadata import entry_points

from caldera.config import Settings
from caldera.notify.base import Notifier

GROUP = "caldera.notifiers"


def available() -> list[str]:
    return sorted(ep.name for ep in entry_points(group=GROUP))


def create_notifiers(settings: Settings) -> dict[str, Notifier]:
    return {ep.name: ep.load()(settings) for ep in entry_points(group=GROUP)}
