"""A report sent over real SMTP to a local aiosmtpd server, parsed back with the email package."""

import email
import email.policy
import re
import socket
from datetime import timedelta

import pytest
from aiosmtpd.controller import Controller
from django.test import override_settings
from django.utils import timezone

from console.models import Job
from console.services import reports
from tests.factories import (
    EpisodeFactory,
    MetricFactory,
    NodeFactory,
    ReportSubscriptionFactory,
    make_job,
)

pytestmark = pytest.mark.django_db

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


class StoringHandler:
    """aiosmtpd handler that keeps every message it accepts."""

    def __init__(self):
        self.envelopes = []

    async def handle_DATA(self, server, session, envelope):
        self.envelopes.append(envelope)
        return "250 Message accepted for delivery"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def smtp_server():
    handler = StoringHandler()
    controller = Controller(handler, hostname="127.0.0.1", port=free_port())
    controller.start()
    try:
        with override_settings(
            EMAIL_BACKEND="django.core.mail.backends.smtp.EmailBackend",
            EMAIL_HOST="127.0.0.1",
            EMAIL_PORT=controller.port,
            EMAIL_HOST_USER="",
            EMAIL_HOST_PASSWORD="",
            EMAIL_USE_TLS=False,
            EMAIL_USE_SSL=False,
            EMAIL_TIMEOUT=10,
        ):
            yield handler
    finally:
        controller.stop()


def test_report_arrives_with_text_html_and_inline_png_charts(smtp_server):
    # Two adaptive recoveries of 3 s and 7 s: mean 5.00 s, worst 7.00 s, downtime 1 + 2 = 3 s,
    # peak p99 max(150, 350) = 350 ms, lost 1 + 1 = 2, duplicates 0 + 3 = 3.
    now = timezone.now()
    job = make_job(name="wc", status=Job.Status.RUNNING)
    for hours_ago, recovery, downtime, p99, lost, dup in [
        (1, 3.0, 1.0, 150, 1, 0),
        (2, 7.0, 2.0, 350, 1, 3),
    ]:
        EpisodeFactory(
            job=job,
            detected_at=now - timedelta(hours=hours_ago),
            recovered_at=now - timedelta(hours=hours_ago) + timedelta(seconds=recovery),
            recovery_time_s=recovery,
            downtime_s=downtime,
            peak_p99_ms=p99,
            lost=lost,
            duplicates=dup,
        )
    node = NodeFactory(name="node-1")
    # cpu 0.25 and 0.75: mean 50.0%, peak 75.0%; mem 0.5: 50.0% / 50.0%.
    for value, minutes_ago in [(0.25, 30), (0.75, 90)]:
        MetricFactory(
            node=node, name="cpu_util", value=value, at=now - timedelta(minutes=minutes_ago)
        )
    MetricFactory(node=node, name="mem_util", value=0.5, at=now - timedelta(minutes=30))
    subscription = ReportSubscriptionFactory(
        name="smtp check", recipients="ops@example.org, lead@example.org"
    )

    reports.send_report(subscription, now=now + timedelta(minutes=1))

    assert len(smtp_server.envelopes) == 1
    envelope = smtp_server.envelopes[0]
    assert sorted(envelope.rcpt_tos) == ["lead@example.org", "ops@example.org"]
    message = email.message_from_bytes(envelope.original_content, policy=email.policy.default)
    assert message["Subject"].startswith("[Backstop] Report 'smtp check': ")
    assert message.get_content_type() == "multipart/related"

    parts = list(message.walk())
    [text_part] = [p for p in parts if p.get_content_type() == "text/plain"]
    [html_part] = [p for p in parts if p.get_content_type() == "text/html"]
    text, html = text_part.get_content(), html_part.get_content()
    assert "wc (adaptive): 2 episodes" in text
    assert "recovery time: mean 5.00 s, worst 7.00 s" in text
    assert "downtime: 3.00 s; peak p99: 350 ms" in text
    assert "lost: 2; duplicates: 3" in text
    assert "node-1: cpu 50.0% / 75.0%, memory 50.0% / 50.0%" in text
    assert '<td class="mean-recovery">5.00</td>' in html
    assert '<td class="worst-recovery">7.00</td>' in html

    images = {p["Content-ID"].strip("<>"): p for p in parts if p.get_content_type() == "image/png"}
    cids = re.findall(r'src="cid:([^"]+)"', html)
    assert len(cids) == 2
    assert sorted(cids) == sorted(images)
    for cid in cids:
        assert images[cid].get_content().startswith(PNG_SIGNATURE)
        assert images[cid].get_content_disposition() == "inline"
