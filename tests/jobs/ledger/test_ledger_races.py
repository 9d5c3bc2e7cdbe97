"""Ledger writes race: late, duplicated and concurrent events never move a job back."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from jobs.ledger.writer import (
    PHASE_DELAYED,
    PHASE_ENQUEUED,
    PHASE_RUNNING,
    TERMINAL,
    Event,
    progress_of,
    write,
)
from jobs.models import Job

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[3]
CREATE = {"actor_name": "a", "queue_name": "q", "enqueued_at": datetime.now(UTC)}


def event(state: str, progress: int, **update: object) -> Event:
    return Event("m-1", state, progress, dict(CREATE), dict(update))


def state() -> str:
    return Job.objects.get(message_id="m-1").state


def test_a_late_enqueued_never_overwrites_running_or_succeeded() -> None:
    write([event("running", progress_of(0, PHASE_RUNNING), attempts=1)])
    write([event("enqueued", progress_of(0, PHASE_ENQUEUED))])
    assert state() == "running"

    write([event("succeeded", TERMINAL)])
    write([event("enqueued", progress_of(0, PHASE_ENQUEUED))])
    write([event("running", progress_of(0, PHASE_RUNNING))])
    assert state() == "succeeded"


def test_a_retry_moves_forward_through_delayed_and_running_again() -> None:
    write([event("running", progress_of(0, PHASE_RUNNING), attempts=1)])
    write([event("delayed", progress_of(1, PHASE_DELAYED))])
    assert state() == "delayed"
    write([event("running", progress_of(1, PHASE_RUNNING), attempts=2)])
    assert state() == "running"
    assert Job.objects.get(message_id="m-1").attempts == 2


def test_a_batch_in_any_order_keeps_the_furthest_state() -> None:
    write(
        [
            event("succeeded", TERMINAL, duration_ms=5),
            event("enqueued", progress_of(0, PHASE_ENQUEUED)),
            event("running", progress_of(0, PHASE_RUNNING), attempts=1),
        ]
    )
    job = Job.objects.get(message_id="m-1")
    assert (job.state, job.attempts, job.duration_ms) == ("succeeded", 1, 5)


def test_threads_inserting_the_same_messages_never_raise() -> None:
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def writer(offset: int) -> None:
        from django.db import connection

        try:
            barrier.wait()
            for n in range(40):
                phase = [PHASE_ENQUEUED, PHASE_RUNNING][(n + offset) % 2]
                e = Event(f"t-{n}", "x", progress_of(0, phase), dict(CREATE))
                e.state = "enqueued" if phase == PHASE_ENQUEUED else "running"
                write([e])
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert Job.objects.count() == 40
    assert set(Job.objects.values_list("state", flat=True)) == {"running"}


def test_processes_writing_the_same_messages_in_random_order_agree(
    test_database_url: str,
) -> None:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "DATABASE_URL": test_database_url,
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.jobs.ledger.ledger_writer_proc", str(seed), "150"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in (1, 2, 3)
    ]
    results = [proc.communicate(timeout=120) for proc in procs]

    for proc, (out, err) in zip(procs, results, strict=True):
        assert proc.returncode == 0, err
        assert out.startswith("ok 450")
    assert Job.objects.filter(actor_name="race").count() == 150
    # Whatever order the three processes' events landed in, each job ends at
    # its terminal event (attempts may stay 0 where "running" arrived after it).
    assert set(Job.objects.values_list("state", "duration_ms").distinct()) == {("succeeded", 1)}


def test_a_redelivered_attempt_counts_as_another_attempt_with_the_lost_one_kept() -> None:
    from datetime import timedelta

    from jobs.models import JobAttempt

    first_start = datetime.now(UTC)
    write(
        [
            event(
                "running",
                progress_of(0, PHASE_RUNNING),
                attempts=1,
                started_at=first_start,
                worker_pid=111,
            )
        ]
    )
    # The worker died; the broker delivered the same message (retries still 0) again.
    second_start = first_start + timedelta(seconds=70)
    write(
        [
            event(
                "running",
                progress_of(0, PHASE_RUNNING),
                attempts=1,
                started_at=second_start,
                worker_pid=222,
            )
        ]
    )
    write([event("succeeded", TERMINAL)])

    job = Job.objects.get(message_id="m-1")
    assert (job.state, job.attempts, job.worker_pid) == ("succeeded", 2, 222)
    [lost] = JobAttempt.objects.filter(job_id="m-1")
    assert (lost.number, lost.error_type, lost.worker_pid) == (1, "WorkerLost", 111)


def test_the_redelivered_attempts_own_failure_is_kept_too() -> None:
    from datetime import timedelta

    from jobs.models import JobAttempt

    first_start = datetime.now(UTC)
    write([event("running", progress_of(0, PHASE_RUNNING), attempts=1, started_at=first_start)])
    second_start = first_start + timedelta(seconds=70)
    # The redelivered attempt (Dramatiq still says retries=0) starts and fails.
    failed = event("running", progress_of(0, PHASE_RUNNING), attempts=1, started_at=second_start)
    failed.failure = {"number": 1, "finished_at": second_start, "error_type": "Boom"}
    write([failed])

    rows = list(JobAttempt.objects.filter(job_id="m-1").values_list("number", "error_type"))
    assert rows == [(1, "WorkerLost"), (2, "Boom")]
