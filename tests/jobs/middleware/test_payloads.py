"""Payloads are checked against the actor's signature; oversize ones are refused at send."""

from __future__ import annotations

from typing import Any

import dramatiq
import pytest

from jobs.ledger import writer as ledger
from jobs.middleware.payloads import InvalidPayload, PayloadTooLarge
from jobs.models import Job
from tests.conftest import AttemptRecorder, join, queued_messages
from tests.examples.tasks import demo_pipeline

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((42,), {}),  # key must be a str
        (("k",), {"steps": "5"}),  # strict: no "5" -> 5
        (("k",), {"steps": 2.5}),
        (("k",), {"colour": "red"}),  # no such parameter
        ((), {}),  # key missing
        (("k", 1, 2, 3, 4), {}),  # too many
    ],
)
def test_an_invalid_payload_fails_permanently_and_is_recorded(
    worker: dramatiq.Worker,
    attempts: AttemptRecorder,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> None:
    message = demo_pipeline.send_with_options(args=args, kwargs=kwargs)
    join("default")
    ledger.flush()

    assert len(attempts.attempts) == 1  # never retried
    assert isinstance(attempts.attempts[0][2], InvalidPayload)
    job = Job.objects.get(message_id=message.message_id)
    assert (job.state, job.error_type) == ("failed", "InvalidPayload")


def test_an_oversize_payload_is_refused_at_send_time(settings) -> None:
    settings.JOBS_MAX_PAYLOAD_BYTES = 1024
    with pytest.raises(PayloadTooLarge, match="JOBS_MAX_PAYLOAD_BYTES"):
        demo_pipeline.send("x" * 2000)
    assert queued_messages("default") == []
    demo_pipeline.send("small")
    assert len(queued_messages("default")) == 1


@pytest.mark.parametrize("delay", [None, 60_000])
def test_a_send_encodes_the_message_once(monkeypatch, delay: int | None) -> None:
    # Given the real broker and Redis, with each use of Dramatiq's encoder counted
    encoder = dramatiq.get_encoder()
    encode, calls = encoder.encode, []

    def counted(data: Any) -> bytes:
        calls.append(data["message_id"])
        return encode(data)

    monkeypatch.setattr(encoder, "encode", counted)
    # When a message is sent (and checked for size on the way)
    message = demo_pipeline.send_with_options(args=("k",), delay=delay)
    # Then the size check read the bytes the broker sent: one encoding
    assert calls == [message.message_id]
    queue = "default.DQ" if delay else "default"
    assert [m.args for m in queued_messages(queue)] == [("k",)]


class _GrowsMessages(dramatiq.Middleware):
    def before_enqueue(self, broker: Any, message: dramatiq.Message[Any], delay: int) -> None:
        message.options["note"] = "y" * 2000


def test_an_option_added_after_the_size_check_hook_still_counts(broker, settings) -> None:
    # Given a middleware listed after Payloads that enlarges every message
    settings.JOBS_MAX_PAYLOAD_BYTES = 1024
    grows = _GrowsMessages()
    broker.middleware.append(grows)
    try:
        # When a small message is sent, Then the final message is what is measured
        with pytest.raises(PayloadTooLarge, match="JOBS_MAX_PAYLOAD_BYTES"):
            demo_pipeline.send("small")
    finally:
        broker.middleware.remove(grows)
    assert queued_messages("default") == []
