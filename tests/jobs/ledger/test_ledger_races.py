"""Ledger writes race: late, duplicated and concurrent events never move a job back."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.conf import settings

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
from tests.conftest import database_url

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parents[3]
CREATE = {"actor_name": "a", "queue_name": "q", "enqueued_at": datetime.now(UTC)}


def writer_env() -> dict[str, str]:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "project.settings"}
    # The shipped flush interval (tests/settings.py writes at once), so the
    # subprocess writes its events in batches as a worker does.
    env.pop("JOBS_LEDGER_FLUSH_MS", None)
    return {**env, "DATABASE_URL": database_url()}


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


def test_processes_writing_the_same_messages_in_random_order_agree() -> None:
    env = writer_env()
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


def test_a_start_that_resumes_a_deferred_attempt_is_no_new_attempt_unless_redelivered() -> None:
    from datetime import timedelta

    from jobs.models import JobAttempt

    start = datetime.now(UTC)
    write([event("running", progress_of(0, PHASE_RUNNING), attempts=1, started_at=start)])
    # A rate limit deferred it: "delayed" for the same attempt, then it resumes.
    write([event("delayed", progress_of(0, PHASE_DELAYED, deferrals=1))])
    assert state() == "delayed"
    resumed = event("running", progress_of(0, PHASE_RUNNING, deferrals=1), attempts=1)
    resumed.update["started_at"], resumed.resumes = start + timedelta(seconds=2), True
    write([resumed])
    assert Job.objects.get(message_id="m-1").attempts == 1
    assert not JobAttempt.objects.exists()

    # The worker of the resumed delivery died; the broker delivered it again.
    again = event("running", progress_of(0, PHASE_RUNNING, deferrals=1), attempts=1)
    again.update["started_at"], again.resumes = start + timedelta(seconds=70), True
    write([again])

    job = Job.objects.get(message_id="m-1")
    assert (job.state, job.attempts) == ("running", 2)
    assert list(JobAttempt.objects.values_list("number", "error_type")) == [(1, "WorkerLost")]


def read_line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    return proc.stdout.readline().strip()


def test_it_writes_concurrent_batches_in_opposite_orders_without_losing_events(
    tmp_path: Path,
) -> None:
    # Given a producer and a worker process whose batches touch the same
    # messages in opposite orders, the worker's in two interleaved shapes
    rounds, count = 20, 100
    sizes = [str(rounds), str(count)]
    procs = {}
    for role in ("producer", "worker"):
        # A file, not a pipe: a run that fails logs many tracebacks. The child
        # keeps its own descriptor; ours is closed at once.
        with (tmp_path / f"{role}.err").open("w") as err:
            procs[role] = subprocess.Popen(
                [sys.executable, "-m", "tests.jobs.ledger.ledger_batches_proc", role, *sizes],
                cwd=ROOT,
                env=writer_env(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
            )
    try:
        for proc in procs.values():
            assert read_line(proc) == "ready"
        # When both write each round's batch at the same moment
        for _ in range(rounds):
            start_at = time.time() + 0.05
            for proc in procs.values():
                assert proc.stdin is not None
                proc.stdin.write(f"go {start_at}\n")
                proc.stdin.flush()
            for proc in procs.values():
                assert read_line(proc) == "done"
        summaries = {role: read_line(proc) for role, proc in procs.items()}
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()

    # Then every job shows the worker's last event, and no batch failed or
    # even deadlocked (the ledger retries those, but a lock order prevents them)
    rows = dict(Job.objects.filter(actor_name="batches").values_list("message_id", "state"))
    expected = {
        f"b-{r:03d}-{n:04d}": "succeeded" if n % 2 == 0 else "running"
        for r in range(rounds)
        for n in range(count)
    }
    wrong = {k: (rows.get(k), v) for k, v in expected.items() if rows.get(k) != v}
    assert len(wrong) == 0, f"{len(wrong)} of {len(expected)} jobs left behind"
    for role, summary in summaries.items():
        errors = (tmp_path / f"{role}.err").read_text()
        assert summary == "failures 0 retries 0", (role, errors[-3000:])


@pytest.mark.skipif(
    not settings.DATABASES["default"]["ENGINE"].endswith("postgresql"),
    reason="SQLite takes its write lock at BEGIN: writers queue, they never deadlock",
)
def test_it_retries_a_batch_that_lost_a_deadlock(settings) -> None:
    from django.db import connection, transaction

    from jobs.ledger import writer as ledger

    # Given the shipped batch writer (tests/settings.py writes at once) and two jobs
    settings.JOBS_LEDGER_FLUSH_MS = 200
    for message_id in ("d-a", "d-b"):
        write([Event(message_id, "enqueued", progress_of(0, PHASE_ENQUEUED), dict(CREATE))])
    locked_b = threading.Event()
    errors: list[BaseException] = []

    def blocker() -> None:
        # Another transaction taking the two rows in the other order: b, then a
        # once the ledger writer holds a and waits for b.
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                # Its deadlock check runs long after the writer's (1 s), so
                # PostgreSQL aborts the writer's transaction, not this one.
                cursor.execute("SET LOCAL deadlock_timeout = '20s'")
                Job.objects.filter(message_id="d-b").update(worker_host="blocker")
                locked_b.set()
                # pg_locks, not pg_stat_activity: the latter is a snapshot
                # taken once per transaction.
                for _ in range(500):
                    cursor.execute("SELECT count(*) FROM pg_locks WHERE NOT granted")
                    if cursor.fetchone()[0]:
                        break
                    time.sleep(0.01)
                else:
                    raise AssertionError("the ledger writer never waited for row b")
                Job.objects.filter(message_id="d-a").update(worker_host="blocker")
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=blocker)
    thread.start()
    assert locked_b.wait(5)

    # When the writer's batch (a, then b) is chosen as the deadlock victim
    retries = ledger.stats.retries
    for message_id in ("d-a", "d-b"):
        running = {"attempts": 1, "worker_host": "worker"}
        ledger.record(Event(message_id, "running", progress_of(0, PHASE_RUNNING), CREATE, running))
    assert ledger.flush()
    thread.join()

    # Then the batch was written again, whole, after the blocker committed
    assert errors == []
    assert ledger.stats.retries - retries == 1
    rows = set(Job.objects.values_list("message_id", "state", "worker_host"))
    assert rows == {("d-a", "running", "worker"), ("d-b", "running", "worker")}


def test_a_batch_notes_each_running_jobs_error_but_never_a_finished_jobs() -> None:
    # Given three jobs: two running, one already succeeded with no error
    start = progress_of(0, PHASE_RUNNING)
    write(
        [
            Event(f"m-{n}", "running", start, dict(CREATE), {"attempts": 1}, subjects=())
            for n in (1, 2)
        ]
        + [Event("m-3", "succeeded", TERMINAL, dict(CREATE))]
    )

    # When one batch carries each job's failed attempt, to be retried (an
    # annotation, whatever the progress), the third arriving after its end
    def failed(message_id: str, error: str) -> Event:
        errors = {"error_type": error, "error_message": f"{error} in {message_id}"}
        return Event(message_id, "running", start, dict(CREATE), annotate=errors)

    write([failed("m-2", "KeyError"), failed("m-3", "Late"), failed("m-1", "ValueError")])

    # Then each running job shows its own error and the finished one none
    rows = Job.objects.order_by("message_id").values_list("message_id", "error_message")
    assert list(rows) == [("m-1", "ValueError in m-1"), ("m-2", "KeyError in m-2"), ("m-3", "")]
