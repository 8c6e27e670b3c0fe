"""A JSON POST to the user's webhook URL (a chat bot): the message's fields, nothing of the platform's.

The URL is the user's, so it is reached as ``caldera.outbound`` says (public addresses, or those inside
``webhook_allowed_networks``, connected to as checked); redirects are not followed."""

from __future__ import annotations

import json
from dataclasses import asdict

from caldera import outbound
from caldera.config import Settings
from caldera.notify.base import DeliveryError, Message

MAX_URL_CHARS = outbound.MAX_URL_CHARS


def valid_url(url: str) -> bool:
    try:
        outbound.check_url(url)
    except outbound.OutboundRefused:
        return False
    return True


class WebhookNotifier:
    def __init__(self, settings: Settings) -> None:
        self.timeout = settings.notify_timeout_s
        self.allowed = outbound.networks(settings.webhook_allowed_networks)

    def deliver(self, message: Message, target: str) -> None:
        try:
            conn, path = outbound.open_connection(target, self.allowed, self.timeout)
        except outbound.OutboundRefused as exc:
            raise DeliveryError(f"webhook: {exc}") from exc
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
