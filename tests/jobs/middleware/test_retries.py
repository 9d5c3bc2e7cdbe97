"""Retries re-enqueue failed messages whatever the size of their traceback."""

from __future__ import annotations

from collections import Counter
from typing import Any

import dramatiq
import pytest
from django.conf import settings

from jobs.broker import queues
from jobs.ledger import writer as ledger
from jobs.models import Job
from tests.conftest import dead_messages, join

pytestmark = pytest.mark.django_db(transaction=True)
QUEUE = "retries-test"
calls: Counter[str] = Counter()


@dramatiq.actor(queue_name=QUEUE, max_retries=1)
def parse_document(key: str, document: str, failures: int) -> None:
    calls[key] += 1
    if calls[key] <= failures:
        # Like many parsers' errors, the message quotes the whole input, so the
        # traceback Retries keeps in the message is as large as the payload.
        raise ValueError(f"cannot parse {document!r}")


def near_the_limit() -> str:
    # The shipped JOBS_MAX_PAYLOAD_BYTES (tests do not change it): the producer's
    # message fits, with its traceback added it does not.
    return "x" * (settings.JOBS_MAX_PAYLOAD_BYTES - 1024)


def job_after_run(message: dramatiq.Message[Any]) -> Job:
    join(QUEUE)
    ledger.flush()
    return Job.objects.get(message_id=message.message_id)


@pytest.fixture(autouse=True)
def _reset_calls() -> None:
    calls.clear()


def test_it_retries_a_message_near_the_size_limit_with_a_huge_traceback(
    worker: dramatiq.Worker,
) -> None:
    message = parse_document.send("once", near_the_limit(), 1)

    job = job_after_run(message)

    assert calls["once"] == 2  # the retry ran; it was not acked and forgotten
    assert (job.state, job.attempts) == ("succeeded", 2)


def test_it_fails_for_good_and_dead_letters_a_message_whose_retries_run_out(
    worker: dramatiq.Worker,
) -> None:
    message = parse_document.send("always", near_the_limit(), 99)

    job = job_after_run(message)

    assert calls["always"] == 2
    assert (job.state, job.attempts, job.error_type) == ("failed", 2, "ValueError")
    assert queues.queue_stats(QUEUE).dead == 1
    [dead] = dead_messages(QUEUE)
    # Retry bookkeeping adds a bounded traceback to Redis, not a second copy of
    # the payload; its end (the error line) is what is kept.
    assert len(dead.encode()) - len(message.encode()) < 10_000
    assert dead.options["traceback"].rstrip().endswith("'")
