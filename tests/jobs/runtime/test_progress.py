"""Progress reports: throttled writes, kept across retries, shown in the admin."""

from __future__ import annotations

from typing import Any

import dramatiq
import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client

from jobs.consistency import checkpoints
from jobs.ledger import writer as ledger
from jobs.models import Job
from jobs.runtime import progress
from tests.conftest import IDLE_POLL_MS, join

pytestmark = pytest.mark.django_db(transaction=True)
QUEUE = "progress-test"
seen: dict[str, Any] = {}


def counting_progress_writes(writes: list[str]) -> Any:
    """A query wrapper that appends each progress UPDATE's SQL to ``writes``."""

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if "progress_done" in sql and sql.lstrip().upper().startswith("UPDATE"):
            writes.append(sql)
        return execute(sql, params, many, context)

    return connection.execute_wrapper(count)


@dramatiq.actor(queue_name=QUEUE, actor_name="progress_tight_loop")
def tight_loop(items: int) -> None:
    writes: list[str] = []
    with counting_progress_writes(writes):
        for n in range(items + 1):
            progress.report(n, items, f"item {n}")
    seen["writes"] = len(writes)


@dramatiq.actor(queue_name=QUEUE, actor_name="progress_past_total")
def past_total(reports: int) -> None:
    writes: list[str] = []
    with counting_progress_writes(writes):
        for n in range(reports):
            progress.report(n, 10)  # a total that was a guess, long passed
    progress.report(2**70, 2**70, "beyond any column")  # clamped, never the job's failure
    seen["writes"] = len(writes)


@dramatiq.actor(
    queue_name=QUEUE,
    max_retries=2,
    min_backoff=10,
    max_backoff=20,
    actor_name="progress_three_steps",
)
def three_steps() -> None:
    message = dramatiq.middleware.CurrentMessage.get_current_message()
    assert message is not None
    row = Job.objects.get(message_id=message.message_id)
    seen.setdefault("progress at start", []).append(row.progress_done)
    for step in ("fetch", "render", "store"):
        if checkpoints.done(step):
            continue
        if step == "store" and not seen.get("failed once"):
            seen["failed once"] = True
            raise ConnectionError("the store is away; retried")
        checkpoints.save(step, total=3)


def run_queue(broker: dramatiq.Broker) -> None:
    worker = dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=1)
    worker.start()
    try:
        join(QUEUE)
    finally:
        worker.stop()
    ledger.flush()


@pytest.fixture(autouse=True)
def _clear() -> None:
    seen.clear()


def test_a_tight_loop_writes_progress_a_few_times_not_per_item(broker: dramatiq.Broker) -> None:
    message = tight_loop.send(5_000)
    run_queue(broker)

    job = Job.objects.get(message_id=message.message_id)
    assert (job.progress_done, job.progress_total, job.progress_note) == (5_000, 5_000, "item 5000")
    # The first report, one per JOBS_PROGRESS_INTERVAL_MS (1 s) at most, and
    # the one that reaches the total: a loop of milliseconds writes about twice.
    assert 1 <= seen["writes"] <= 4, seen["writes"]


def test_reports_past_the_total_are_throttled_and_huge_values_are_clamped(
    broker: dramatiq.Broker,
) -> None:
    message = past_total.send(3_000)
    run_queue(broker)

    job = Job.objects.get(message_id=message.message_id)
    assert job.state == "succeeded"
    assert (job.progress_done, job.progress_total) == (2**63 - 1, 2**63 - 1)
    assert seen["writes"] <= 5, seen["writes"]  # not one per report past the total


def test_checkpoints_report_progress_and_a_retry_starts_from_them(
    broker: dramatiq.Broker,
) -> None:
    message = three_steps.send()
    run_queue(broker)

    job = Job.objects.get(message_id=message.message_id)
    assert job.state == "succeeded"
    assert job.attempts == 2
    assert (job.progress_done, job.progress_total) == (3, 3)
    # The first attempt started from nothing; the retry from its two saved steps.
    assert seen["progress at start"] == [None, 2]


def test_bad_progress_values_are_a_clear_error() -> None:
    with pytest.raises(ValueError, match="done must be an int >= 0"):
        progress.report(-1, 5)
    with pytest.raises(ValueError, match="total must be an int"):
        progress.report(1, "5")  # type: ignore[arg-type]
    progress.report(1, 5)  # outside a job: nothing to record, no error


def test_the_admin_shows_a_progress_bar(broker: dramatiq.Broker, client: Client) -> None:
    message = tight_loop.send(10)
    run_queue(broker)
    User.objects.create_superuser("root", "root@example.com", "pw")
    client.login(username="root", password="pw")
    job = Job.objects.get(message_id=message.message_id)

    listing = client.get("/admin/jobs/job/").content.decode()
    detail = client.get(f"/admin/jobs/job/{job.pk}/change/").content.decode()

    for page in (listing, detail):
        assert '<progress value="10" max="10"></progress>' in page
        assert "10 / 10 (100%): item 10" in page
