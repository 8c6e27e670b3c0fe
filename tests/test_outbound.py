"""One check for every URL the platform is asked to reach (caldera/outbound.py): a webhook and an import refuse
the same URLs for the same reasons."""

import pytest

from caldera import outbound
from caldera.notify.base import DeliveryError, Message
from caldera.notify.webhook import WebhookNotifier, valid_url
from tests.conftest import make_settings


@pytest.mark.parametrize(
    ("url", "why"),
    [("ftp://example.org/x", "only http and https"), ("http://user:pw@127.0.0.1/hook", "credentials"),
     ("http://example.org/données", "ASCII"), ("http://example.org:port/", "port"), ("http:///x", "no host"),
     ("http://example.org/" + "a" * 3000, "at most")],
)  # fmt: skip
def test_webhooks_and_imports_refuse_the_same_urls(tmp_path, url, why):
    with pytest.raises(outbound.OutboundRefused, match=why):
        outbound.check_url(url)
    assert not valid_url(url)
    notifier = WebhookNotifier(make_settings(tmp_path, webhook_allowed_networks=["127.0.0.0/8"]))
    with pytest.raises(DeliveryError, match=why):
        notifier.deliver(Message("carol", "job_failed", "s", "b", None, 0.0), url)
