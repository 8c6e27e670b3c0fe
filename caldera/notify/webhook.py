"""A JSON POST to the user's webhook URL (a chat bot): the message's fields, nothing of the platform's.

The URL is the user's, so the platform must not become their way into its own network: the host is resolved once,
every address must be public (or inside ``webhook_allowed_networks``), and the connection goes to the address that
was checked (no second lookup to rebind); redirects are not followed."""

from __future__ import annotations

import http.client
import ipaddress
import json
import socket
from dataclasses import asdict
from urllib.parse import urlsplit

from caldera.config import Settings
from caldera.notify.base import DeliveryError, Message

MAX_URL_CHARS = 2048


def valid_url(url: str) -> bool:
    parts = urlsplit(url)
    return len(url) <= MAX_URL_CHARS and parts.scheme in ("http", "https") and bool(parts.hostname)


class WebhookNotifier:
    def __init__(self, settings: Settings) -> None:
        self.timeout = settings.notify_timeout_s
        self.allowed = [ipaddress.ip_network(n) for n in settings.webhook_allowed_networks]

    def _checked_address(self, host: str, port: int) -> str:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise DeliveryError(f"webhook: cannot resolve {host}: {exc}") from exc
        addresses = {info[4][0] for info in infos}
        for address in addresses:
            ip = ipaddress.ip_address(address)
            if not ip.is_global and not any(ip in net for net in self.allowed):
                raise DeliveryError(f"webhook: {host} is a non-public address ({address}), refused")
        return sorted(addresses)[0]

    def deliver(self, message: Message, target: str) -> None:
        if not valid_url(target):
            raise DeliveryError("webhook: the URL is not http(s)")
        parts = urlsplit(target)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        address = self._checked_address(parts.hostname or "", port)
        kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        conn = kind(parts.hostname, port, timeout=self.timeout)
        # connect to the checked address; TLS still verifies the certificate against the URL's host name
        conn._create_connection = lambda _addr, timeout, source: socket.create_connection(  # type: ignore[attr-defined]
            (address, port), timeout, source
        )
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
