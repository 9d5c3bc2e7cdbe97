"""Actor rate limits: a burst through a real in-process worker."""

from __future__ import annotations

import threading
import time

import dramatiq
import pytest
from django.contrib.auth.models import User
from django.core import mail

from accounts.tasks import send_welcome_email
from jobs.consistency.ratelimits import RateLimited, rate_limited
from tests.conftest import AttemptRecorder, dead_messages, join

pytestmark = pytest.mark.django_db(transaction=True)

starts: list[float] = []
starts_mutex = threading.Lock()


@dramatiq.actor(queue_name="rate-tests", max_retries=1)
@rate_limited("burst-test", limit=4)
def limited_job(n: int) -> None:
    with starts_mutex:
        starts.append(time.time())


def test_a_burst_respects_the_rate_and_nothing_fails(
    worker: dramatiq.Worker, attempts: AttemptRecorder
) -> None:
    starts.clear()
    # Given 12 jobs at once against a limit of 4 per second
    for n in range(12):
        limited_job.send(n)
    join("rate-tests", timeout_ms=20_000)

    # Then all ran, none failed, though each may have been deferred more than
    # max_retries=1 times: deferrals do not use up retries
    assert len(starts) == 12
    assert dead_messages("rate-tests") == []
    errors = [exc for _, _, exc in attempts.attempts if exc is not None]
    assert errors
    assert all(isinstance(exc, RateLimited) for exc in errors)
    # At most 4 per wall-clock second (the limiter's windows). A start is seen a
    # little after the limiter's decision, so starts in the first 20 ms of a
    # second may belong to the window before and are left out of that count.
    per_second: dict[int, int] = {}
    for started in starts:
        if started % 1 >= 0.02:
            per_second[int(started)] = per_second.get(int(started), 0) + 1
    assert max(per_second.values()) <= 4
    # ... so 12 jobs span at least three windows
    assert len({int(started) for started in starts}) >= 3
    assert max(starts) - min(starts) > 1.0


def test_welcome_emails_are_limited_per_second_by_the_setting(
    worker: dramatiq.Worker, settings
) -> None:
    settings.WELCOME_EMAIL_RATE_PER_SECOND = 2
    users = [User.objects.create_user(f"u{n}", f"u{n}@example.com", "pw") for n in range(5)]
    started = time.monotonic()

    for user in users:
        send_welcome_email.send(user.pk)
    join("emails", timeout_ms=20_000)

    assert len(mail.outbox) == 5
    assert time.monotonic() - started > 1.0  # 5 at 2/s need three windows
