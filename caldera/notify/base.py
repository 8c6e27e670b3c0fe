"""The notifier contract: a class taking the platform's Settings whose ``deliver`` sends one message to one
target (an address, a URL) or raises ``DeliveryError``; the outbox retries it later."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class DeliveryError(Exception):
    """This attempt failed (server down, refused, timed out); the reason is kept on the outbox row."""


@dataclass(frozen=True)
class Message:
    user: str
    event: str
    subject: str
    body: str
    job_id: str | None
    created_at: float


class Notifier(Protocol):
    def deliver(self, message: Message, target: str) -> None: ...
