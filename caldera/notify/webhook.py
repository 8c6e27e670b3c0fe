"""A JSON POST to the user's webhook URL (a chat bot): the message's fields, nothing of the platform's.

The URL is the user's, so it is reached as ``caldera.outbound`` says (public addresses, or those inside
``webhook_allowed_networks``, connected to as checked); redirects are not followed."""

from __future__ import annotations

import ipaddress
import json
from dataclasses import asdict
from urllib.parse import urlsplit

from caldera import outbound
from caldera.config import Settings
from caldera.notify.base import DeliveryError, Message

MAX_URL_CHARS = 2048


def valid_url(url: str) -> bool:
    parts = urlsplit(url)
    return len(url) <= MAX_URL_CHARS and parts.scheme in outbound.SCHEMES and bool(parts.hostname)


class WebhookNotifier:
    def __init__(self, settings: Settings) -> None:
        self.timeout = settings.notify_timeout_s
        self.allowed = [ipaddress.ip_network(n) for n in settings.webhook_allowed_networks]

    def deliver(self, message: Message, target: str) -> None:
        if not valid_url(target):
            raise DeliveryError("webhook: the URL is not http(s)")
        parts = urlsplit(target)
        try:
            address = outbound.checked_address(parts.hostname or "", parts.port or 0, self.allowed)
        except outbound.OutboundRefused as exc:
            raise DeliveryError(f"webhook: {exc}") from exc
        conn = outbound.connection(target, address, self.timeout)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        try:
            conn.request("POST", path, json.dumps(asdict(message)), {"Content-Type": "application/json"})
            response = conn.getresponse()
            response.read(1024)
        except OSError as exc:
            raise DeliveryError(f"webhook: {exc}") from exc
        finally:
            conn.close()
        if response.status >= 300:
            raise DeliveryError(f"webhook: HTTP {response.status}")
