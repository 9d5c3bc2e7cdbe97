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
