"""Values a database cannot store never cost the ledger other jobs' events."""

from __future__ import annotations

import logging
from collections import Counter
from datetime import UTC, datetime

import dramatiq
import pytest

from jobs.errors import PermanentJobError
from jobs.ledger import operations
from jobs.ledger import writer as ledger
from jobs.ledger.writer import PHASE_ENQUEUED, TERMINAL, Event, progress_of
from jobs.models import Job, JobAttempt
from tests.conftest import IDLE_POLL_MS, join, queued_messages

pytestmark = pytest.mark.django_db(transaction=True)
QUEUE = "ledger-storage-test"
# NUL: PostgreSQL's text and jsonb refuse it. A lone surrogate: not UTF-8 at all.
HOSTILE = "nul\x00 and lone \ud800 surrogate"
STORED = "nul\ufffd and lone \ufffd surrogate"


@dramatiq.actor(queue_name=QUEUE)
def fine(n: int) -> None:
    pass


@dramatiq.actor(queue_name=QUEUE)
def refuse(text: str) -> None:
    raise PermanentJobError(f"cannot use {text}")


def test_it_stores_arguments_and_errors_the_database_cannot_take_as_they_are(
    broker: dramatiq.Broker, settings
) -> None:
    # Given the shipped flush interval (tests/settings.py writes at once), so
    # the hostile job's events share their batches with other jobs' events
    settings.JOBS_LEDGER_FLUSH_MS = 200
    messages = [fine.send(n) for n in range(3)]
    hostile = refuse.send(HOSTILE)
    messages += [hostile, *(fine.send(n) for n in range(3, 6))]

    # When a worker runs them all
    worker = dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=2)
    worker.start()
    try:
        join(QUEUE)
    finally:
        worker.stop()
    assert ledger.flush()

    # Then every job is recorded, the hostile one with its text made storable
    jobs = {job.message_id: job for job in Job.objects.all()}
    states = Counter(jobs[m.message_id].state for m in messages if m.message_id in jobs)
    assert states == {"succeeded": 6, "failed": 1}
    job = jobs[hostile.message_id]
    assert job.args == [STORED]
    assert job.error_message == f"cannot use {STORED}"
    assert STORED in job.traceback
    [attempt] = JobAttempt.objects.filter(job=job)
    assert attempt.error_message == f"cannot use {STORED}"


def test_it_writes_the_rest_of_a_batch_when_one_event_cannot_be_stored(
    settings, caplog: pytest.LogCaptureFixture
) -> None:
    # Given the shipped flush interval, and a batch with one event the database
    # refuses whatever its text (a negative duration breaks a CHECK constraint)
    settings.JOBS_LEDGER_FLUSH_MS = 200
    create = {"actor_name": "a", "queue_name": "q", "enqueued_at": datetime.now(UTC)}
    failures = ledger.stats.write_failures
    for n in range(5):
        ledger.record(Event(f"ok-{n}", "succeeded", TERMINAL, dict(create), {"duration_ms": 1}))
    ledger.record(Event("bad", "succeeded", TERMINAL, dict(create), {"duration_ms": -1}))
    ledger.record(Event("ok-5", "enqueued", progress_of(0, PHASE_ENQUEUED), dict(create)))

    # When the batch is written
    with caplog.at_level(logging.ERROR, logger="jobs.ledger.writer"):
        assert ledger.flush()

    # Then only that one event is lost, counted and logged with its job
    stored = dict(Job.objects.values_list("message_id", "state"))
    # (the refused job keeps a row with its state and what was refused)
    expected = {**{f"ok-{n}": "succeeded" for n in range(5)}, "ok-5": "enqueued"}
    assert stored == {**expected, "bad": "succeeded"}
    assert Job.objects.get(message_id="bad").error_type == ledger.VALUES_REFUSED
    assert ledger.stats.write_failures - failures == 1
    assert "Job ledger refused the values of job bad" in caplog.text


def test_a_duration_longer_than_its_column_holds_is_stored_at_the_columns_top(settings) -> None:
    # Given the shipped flush interval and, in one batch with another job, a job
    # that ran for 25 days: more milliseconds than an integer column holds
    # (PostgreSQL refused the value, or took it wrapped around to a negative
    # number that its CHECK refused; SQLite kept it, beyond the model's range)
    settings.JOBS_LEDGER_FLUSH_MS = 200
    create = {"actor_name": "a", "queue_name": "q", "enqueued_at": datetime.now(UTC)}
    long_ms = 25 * 24 * 3600 * 1000
    ledger.record(Event("short", "succeeded", TERMINAL, dict(create), {"duration_ms": 7}))
    ledger.record(Event("long", "succeeded", TERMINAL, dict(create), {"duration_ms": long_ms}))

    # When the batch is written
    failures = ledger.stats.write_failures
    assert ledger.flush()

    # Then both jobs are recorded, the long one with the most the column holds
    assert ledger.stats.write_failures == failures
    durations = dict(Job.objects.values_list("message_id", "duration_ms"))
    assert durations == {"short": 7, "long": 2**31 - 1}


def test_it_stores_every_json_column_with_unstorable_values_nested_among_its_batchmates(
    settings,
) -> None:
    # Given the shipped flush interval and, in one batch among other jobs, a job
    # whose every JSON column holds NUL, a lone surrogate (in keys too) and the
    # NaN and Infinity that Python's json writes and no database's JSON takes
    settings.JOBS_LEDGER_FLUSH_MS = 200
    hostile = {"a\x00": [HOSTILE, {"\ud800": float("nan")}], "b": (float("inf"), -float("inf"))}
    stored = {"a\ufffd": [STORED, {"\ufffd": "NaN"}], "b": ["Infinity", "-Infinity"]}
    create = {"actor_name": "a", "queue_name": "q", "enqueued_at": datetime.now(UTC)}
    columns = {"args": [hostile], "kwargs": hostile, "options": hostile}
    for n in range(3):
        ledger.record(Event(f"ok-{n}", "enqueued", progress_of(0, PHASE_ENQUEUED), dict(create)))
    ledger.record(
        Event("hostile", "succeeded", TERMINAL, {**create, **columns}, {"return_value": hostile})
    )

    # When the batch is written
    failures = ledger.stats.write_failures
    assert ledger.flush()

    # Then every job is there, the hostile one with each value made storable
    assert ledger.stats.write_failures == failures
    assert Job.objects.count() == 4
    job = Job.objects.get(message_id="hostile")
    assert (job.args, job.kwargs, job.options, job.return_value) == (
        [stored],
        stored,
        stored,
        stored,
    )


def test_it_stores_plain_ascii_text_holding_nul_made_storable(settings) -> None:
    # Given text that is ASCII but for a NUL (no surrogate, nothing non-ASCII),
    # in a column, an argument and a reference, among a batchmate's plain text
    settings.JOBS_LEDGER_FLUSH_MS = 200
    create = {"actor_name": "a\x00b", "queue_name": "q", "enqueued_at": datetime.now(UTC)}
    ledger.record(Event("plain", "enqueued", progress_of(0, PHASE_ENQUEUED), dict(create)))
    ledger.record(
        Event(
            "nul",
            "enqueued",
            progress_of(0, PHASE_ENQUEUED),
            {**create, "args": ["x\x00y"]},
            subjects=("auth.user:\x00",),
        )
    )

    # When the batch is written
    assert ledger.flush()

    # Then the NUL is replaced wherever it was
    job = Job.objects.get(message_id="nul")
    assert (job.actor_name, job.args) == ("a\ufffdb", ["x\ufffdy"])
    assert list(job.references.values_list("subject", flat=True)) == ["auth.user:\ufffd"]
    assert Job.objects.get(message_id="plain").actor_name == "a\ufffdb"


def test_a_failed_job_whose_stored_arguments_were_altered_is_not_retried_from_them() -> None:
    # Given failed jobs whose dead letters are gone, so a retry can only be
    # built from the ledger, two of them with arguments stored altered
    create = {"actor_name": "refuse", "queue_name": QUEUE, "enqueued_at": datetime.now(UTC)}
    for message_id, args in (("nul", [HOSTILE]), ("nan", [float("nan")]), ("plain", ["x"])):
        ledger.record(Event(message_id, "failed", TERMINAL, {**create, "args": args}))

    # When an operator retries them all
    outcome = operations.retry_jobs(Job.objects.all())

    # Then only the one whose arguments are what it was given is sent again
    assert (outcome.done, outcome.skipped) == (1, 2)
    assert [m.args for m in queued_messages(QUEUE)] == [("x",)]
