"""The welcome email through a real in-process worker on the real Redis broker."""

from __future__ import annotations

import logging
import re
import smtplib
import time
from collections.abc import Sequence
from typing import cast

import dramatiq
import pytest
from django.contrib.auth.models import User
from django.core import mail
from django.core.mail import EmailMessage, EmailMultiAlternatives
from django.core.mail.backends.locmem import EmailBackend as LocmemBackend

from accounts.tasks import send_welcome_email
from jobs.errors import PermanentJobError
from jobs.models import EffectRecord
from tests.conftest import AttemptRecorder, dead_messages, join, use_mail_backend

pytestmark = pytest.mark.django_db(transaction=True)


class FlakySMTPBackend(LocmemBackend):
    """An SMTP relay that drops the connection twice, then accepts (boundary mock)."""

    failures_left = 0

    def send_messages(self, messages: Sequence[EmailMessage]) -> int:
        if FlakySMTPBackend.failures_left > 0:
            FlakySMTPBackend.failures_left -= 1
            raise smtplib.SMTPServerDisconnected("connection unexpectedly closed")
        return super().send_messages(messages)


class RefusingSMTPBackend(LocmemBackend):
    def send_messages(self, messages: Sequence[EmailMessage]) -> int:
        raise smtplib.SMTPRecipientsRefused({"x@example.com": (550, b"no such user")})


def make_user(email: str = "ada@example.com") -> User:
    return User.objects.create_user("ada", email, "correct-horse-1")


def test_the_worker_sends_the_welcome_email(worker: dramatiq.Worker) -> None:
    user = make_user()

    send_welcome_email.send(user.pk)
    join("emails")

    assert len(mail.outbox) == 1
    sent = cast(EmailMultiAlternatives, mail.outbox[0])
    assert sent.to == ["ada@example.com"]
    assert "Hello ada" in sent.body
    assert sent.alternatives
    assert "text/html" in sent.alternatives[0][1]
    assert EffectRecord.objects.get(key=f"welcome-email:{user.pk}").state == "done"


def test_a_message_delivered_twice_sends_one_email(
    worker: dramatiq.Worker, broker: dramatiq.Broker
) -> None:
    user = make_user()
    message = send_welcome_email.message(user.pk)

    # The same message twice: what a redelivery after a lost ack looks like.
    broker.enqueue(message)
    broker.enqueue(message)
    send_welcome_email.send(user.pk)  # and a duplicate enqueue from elsewhere
    join("emails")

    assert len(mail.outbox) == 1


def test_a_missing_user_fails_permanently_without_retry(
    worker: dramatiq.Worker, attempts: AttemptRecorder
) -> None:
    message = send_welcome_email.send(987654)
    join("emails")

    assert len(attempts.attempts) == 1
    assert isinstance(attempts.attempts[0][2], PermanentJobError)
    assert [m.message_id for m in dead_messages("emails")] == [message.message_id]
    assert mail.outbox == []


def test_an_invalid_address_fails_permanently_without_retry(
    worker: dramatiq.Worker, attempts: AttemptRecorder
) -> None:
    user = make_user(email="not an address")

    send_welcome_email.send(user.pk)
    join("emails")

    assert len(attempts.attempts) == 1
    assert "invalid email" in str(attempts.attempts[0][2])
    assert mail.outbox == []


def test_a_wrong_payload_type_fails_permanently(
    worker: dramatiq.Worker, attempts: AttemptRecorder
) -> None:
    send_welcome_email.send("1; DROP TABLE auth_user")  # type: ignore[arg-type]
    join("emails")

    assert len(attempts.attempts) == 1
    assert isinstance(attempts.attempts[0][2], PermanentJobError)


def test_a_refused_recipient_is_permanent(
    worker: dramatiq.Worker, attempts: AttemptRecorder, settings
) -> None:
    use_mail_backend(settings, f"{__name__}.RefusingSMTPBackend")
    user = make_user()

    send_welcome_email.send(user.pk)
    join("emails")

    assert len(attempts.attempts) == 1
    assert isinstance(attempts.attempts[0][2], PermanentJobError)
    # The claim was released, so a fixed address can still be welcomed later.
    assert not EffectRecord.objects.exists()


def test_a_dropped_smtp_connection_is_retried_with_growing_delays(
    worker: dramatiq.Worker,
    attempts: AttemptRecorder,
    settings,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="dramatiq.middleware.retries")
    use_mail_backend(settings, f"{__name__}.FlakySMTPBackend")
    FlakySMTPBackend.failures_left = 2
    user = make_user()

    send_welcome_email.send(user.pk)
    join("emails")

    outcomes = [type(exc).__name__ if exc else "ok" for _, _, exc in attempts.attempts]
    assert outcomes == ["SMTPServerDisconnected", "SMTPServerDisconnected", "ok"]
    # The delays Dramatiq chose, from its own log line. JOBS_MIN_BACKOFF_MS=200 in
    # tests: retry 1 waits 200-400 ms, retry 2 400-800 ms (jittered halves of 400
    # and 800). The gaps between attempts cannot be compared with each other: they
    # add the worker's own latency to adjacent jitter ranges (CI saw 0.52 s, 0.49 s).
    delays = [
        int(m.group(1))
        for record in caplog.records
        if (m := re.search(r"Retrying message '[^']+' in (\d+) milliseconds", record.getMessage()))
    ]
    assert len(delays) == 2, delays
    assert 200 <= delays[0] <= 400
    assert 400 <= delays[1] <= 800
    starts = [start for _, start, _ in attempts.attempts]
    # Each retry really waited at least its delay.
    assert starts[1] - starts[0] >= delays[0] / 1000
    assert starts[2] - starts[1] >= delays[1] / 1000
    assert len(mail.outbox) == 1


def test_transient_failures_stop_after_three_attempts(
    worker: dramatiq.Worker, attempts: AttemptRecorder, settings
) -> None:
    use_mail_backend(settings, f"{__name__}.FlakySMTPBackend")
    FlakySMTPBackend.failures_left = 10
    user = make_user()

    message = send_welcome_email.send(user.pk)
    started = time.monotonic()
    join("emails")

    assert len(attempts.attempts) == 3
    assert time.monotonic() - started >= 0.6
    assert [m.message_id for m in dead_messages("emails")] == [message.message_id]
    assert mail.outbox == []
