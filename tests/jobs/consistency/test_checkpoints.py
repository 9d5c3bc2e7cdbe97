"""A job failing at step 3 of 5 resumes at step 3 on retry; its effect applies once."""

from __future__ import annotations

import dramatiq
import pytest

from jobs.ledger import writer as ledger
from jobs.models import EffectRecord, Job, JobCheckpoint
from tests.conftest import AttemptRecorder, join
from tests.examples.tasks import demo_pipeline

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_retry_resumes_after_the_last_finished_step(
    worker: dramatiq.Worker, attempts: AttemptRecorder
) -> None:
    message = demo_pipeline.send("resume", steps=5, fail_at_step=3)
    join("default")
    ledger.flush()

    # Attempt 1 finished steps 1-2 and failed at 3; attempt 2 did 3-5 only.
    assert [type(e).__name__ if e else "ok" for _, _, e in attempts.attempts] == [
        "TransientJobError",
        "ok",
    ]
    rows = list(JobCheckpoint.objects.filter(message_id=message.message_id).order_by("id"))
    assert [row.step for row in rows] == ["1", "2", "3", "4", "5"]
    assert rows[1].created_at < rows[2].created_at
    job = Job.objects.get(message_id=message.message_id)
    assert (job.state, job.attempts) == ("succeeded", 2)
    assert EffectRecord.objects.filter(key="demo-pipeline:resume").count() == 1


def test_a_second_delivery_of_a_finished_job_changes_nothing(
    worker: dramatiq.Worker, broker: dramatiq.Broker
) -> None:
    message = demo_pipeline.message("twice", steps=2)
    broker.enqueue(message)
    join("default")
    broker.enqueue(message)
    join("default")

    assert JobCheckpoint.objects.filter(message_id=message.message_id).count() == 2
    assert EffectRecord.objects.filter(key="demo-pipeline:twice").count() == 1


def test_the_admin_shows_the_checkpoints(worker: dramatiq.Worker, admin_client) -> None:
    message = demo_pipeline.send("shown", steps=2)
    join("default")
    ledger.flush()
    job = Job.objects.get(message_id=message.message_id)

    html = admin_client.get(f"/admin/jobs/job/{job.pk}/change/").content.decode()

    assert "&quot;1&quot;: {" in html
    assert "finished_at" in html
