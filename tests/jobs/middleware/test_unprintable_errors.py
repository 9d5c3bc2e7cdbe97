"""A job whose exception cannot be printed is still recorded failed, not left running."""

from __future__ import annotations

import dramatiq
import pytest

from jobs.ledger import writer as ledger
from jobs.models import Job
from tests.conftest import join

pytestmark = pytest.mark.django_db(transaction=True)
QUEUE = "unprintable-errors-test"
dramatiq.get_broker().declare_queue(QUEUE)  # before any worker: see test_ledger.py


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def fails_badly() -> None:
    raise Unprintable()


def test_an_exception_whose_str_raises_is_recorded_failed(broker: dramatiq.Broker) -> None:
    message = fails_badly.send()
    worker = dramatiq.Worker(broker, queues={QUEUE}, worker_timeout=50, worker_threads=1)
    worker.start()
    try:
        join(QUEUE)
    finally:
        worker.stop()
    ledger.flush()

    job = Job.objects.get(message_id=message.message_id)
    assert job.state == "failed"
    assert job.error_type == "Unprintable"
    assert "Unprintable" in job.traceback


failures_seen: list[dict[str, str]] = []


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def failure_seen(message: dict[str, object], failure: dict[str, str]) -> None:
    failures_seen.append(failure)


@dramatiq.actor(queue_name=QUEUE, max_retries=0, on_failure="failure_seen")
def fails_badly_with_a_callback() -> None:
    raise Unprintable()


@dramatiq.actor(queue_name=QUEUE, max_retries=0, on_failure="failure_seen")
def fails_quoting_its_password(password: str) -> None:
    raise ValueError(f"login refused for {password}")


def test_a_failure_callback_is_sent_whatever_the_error_prints_and_masks_secrets(
    broker: dramatiq.Broker,
) -> None:
    # Dramatiq's own Callbacks raised on str(exception): no callback was sent;
    # and it sent the error's text as it was, secret included.
    failures_seen.clear()
    fails_badly_with_a_callback.send()
    fails_quoting_its_password.send("hunter2-secret")
    worker = dramatiq.Worker(broker, queues={QUEUE}, worker_timeout=50, worker_threads=1)
    worker.start()
    try:
        join(QUEUE)
    finally:
        worker.stop()

    by_type = {failure["type"]: failure["message"] for failure in failures_seen}
    assert by_type["Unprintable"] == "<exception str() failed>"
    assert "hunter2-secret" not in by_type["ValueError"]
    assert by_type["ValueError"].startswith("login refused for")
