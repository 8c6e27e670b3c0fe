"""E-mail through the configured SMTP server (settings ``smtp_*``)."""

from __future__ import annotations

import smtplib
from email.message import EmailMessage

from caldera.config import Settings
from caldera.notify.base import DeliveryError, Message


class EmailNotifier:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def deliver(self, message: Message, target: str) -> None:
        s = self.settings
        if not s.smtp_host:
            raise DeliveryError("no SMTP server configured (CALDERA_SMTP_HOST)")
        mail = EmailMessage()
        mail["From"] = s.smtp_from
        mail["To"] = target
        mail["Subject"] = message.subject
        mail.set_content(message.body)
        try:
            with smtplib.SMTP(s.smtp_host, s.smtp_port, timeout=s.notify_timeout_s) as smtp:
                if s.smtp_starttls:
                    smtp.starttls()
                if s.smtp_username:
                    smtp.login(s.smtp_username, s.smtp_password or "")
                smtp.send_message(mail)
        except (OSError, smtplib.SMTPException) as exc:
            raise DeliveryError(f"SMTP {s.smtp_host}:{s.smtp_port}: {exc}") from exc
