"""End to end: a PostgreSQL that answers but refuses writes for a few seconds
while a real ``rundramatiq`` drains jobs (issue 29, item 1). The refusal is the
server's own, for every session at once, as an operator would cause it:
``ALTER SYSTEM`` and a reload turn on ``default_transaction_read_only`` (a
demoted primary, a maintenance window; SQLSTATE 25006), or set a 200 ms
``statement_timeout`` while a migration-like transaction holds the ledger's
table locked (57014, "canceling statement due to statement timeout"); 4 s later
it is turned off.

Counted from outside: every job's runs (Redis counters the job writes), and its
ledger row once the queue is empty. Nothing may be acked without its row: a
job whose end could not be written keeps its ack until the database takes it.

Run: bin/test --postgres tests/e2e/test_ledger_pg_refusals.py -s
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.db import connection, transaction

from jobs.broker import redis_broker
from jobs.models import Job
from tests.e2e.test_crash_safety import wait_until
from tests.examples.tasks import long_job
from tests.fault_matrix import FaultRow, report

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
READY = "Worker process is ready for action."
JOBS = 150
REFUSAL_S = 4.0


def set_for_every_session(setting: str, value: str | None) -> None:
    """``ALTER SYSTEM`` (``None``: reset) and a reload: every session, the
    worker's included, follows at its next statement."""
    with connection.cursor() as cursor:
        if value is None:
            cursor.execute(f"ALTER SYSTEM RESET {setting}")
        else:
            # ALTER SYSTEM takes no bound parameters; both are this module's constants.
            cursor.execute(f"ALTER SYSTEM SET {setting} = '{value}'")
        cursor.execute("SELECT pg_reload_conf()")


@contextmanager
def refusing(setting: str, value: str, lock: bool) -> Iterator[None]:
    """Writes refused for the block: ``setting`` for every session, and with
    ``lock`` the ledger's table locked against writes by this session."""
    connection.close()
    set_for_every_session(setting, value)
    try:
        if lock:
            with transaction.atomic(), connection.cursor() as cursor:
                # The LOCK is instant (nothing holds the table); the writes that
                # wait behind it are cancelled by the statement timeout.
                cursor.execute("LOCK TABLE jobs_job IN EXCLUSIVE MODE")
                yield
        else:
            yield
    finally:
        connection.close()
        set_for_every_session(setting, None)


@pytest.mark.parametrize(
    ("setting", "value", "lock", "fault"),
    [
        ("default_transaction_read_only", "on", False, "PostgreSQL read-only for 4 s under load"),
        (
            "statement_timeout",
            "200ms",
            True,
            "PostgreSQL statement timeout (table locked) for 4 s under load",
        ),
    ],
)
def test_a_database_refusing_writes_for_seconds_acks_no_job_without_its_row(
    start_worker: Any, setting: str, value: str, lock: bool, fault: str
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip(reason="PostgreSQL only (ALTER SYSTEM): bin/test --postgres")
    client = redis_broker().client
    worker = start_worker(threads=4, queues=("long",))
    worker.wait_for_log(READY)
    # Given a worker draining 150 jobs of 50 ms
    jobs = [long_job.send(f"refused-{n}", 0.05) for n in range(JOBS)]
    wait_until(lambda: int(client.get("long-job:refused-5:ends") or 0) >= 1, timeout=30)

    # When every session's writes are refused for 4 s, then taken again
    with refusing(setting, value, lock):
        time.sleep(REFUSAL_S)

    # Then every job runs once and ends with its row: none acked without it
    def succeeded(ids: list[str]) -> int:
        connection.close()
        return Job.objects.filter(message_id__in=ids, state="succeeded").count()

    lost, twice, wrong = count_after_refusal(
        worker, jobs, "refused", succeeded, fault, "the refusal ended"
    )
    assert (lost, twice, wrong) == (0, 0, 0)


def count_after_refusal(
    worker: Any,
    jobs: list[Any],
    prefix: str,
    succeeded: Callable[[list[str]], int],
    fault: str,
    ended: str,
) -> tuple[int, int, int]:
    """Once the queue has drained after a refusal the worker saw: (lost, run
    twice, rows not succeeded) of ``long_job``s ``<prefix>-<n>``, reported as
    ``fault``'s row; the refusal seen and no event given up are asserted."""
    client = redis_broker().client
    refused_at_all = "refusing writes" in worker.log() or "will be tried again" in worker.log()
    msgs = f"{redis_broker().namespace}:long.msgs"
    started = time.monotonic()
    wait_until(lambda: client.hlen(msgs) == 0, timeout=90)
    recovered = time.monotonic() - started
    ids = [job.message_id for job in jobs]
    # The last batch is written within moments of the last ack (acks follow it).
    wait_until(lambda: succeeded(ids) == len(jobs), timeout=10)
    runs = [int(client.get(f"long-job:{prefix}-{n}:ends") or 0) for n in range(len(jobs))]
    lost = sum(1 for count in runs if count == 0)
    twice = sum(1 for count in runs if count > 1)
    wrong = len(jobs) - succeeded(ids)
    unrecorded = worker.log().count("not recorded")
    print(
        f"\n{fault}: {len(jobs)} jobs, lost {lost}, run twice {twice}, rows not succeeded "
        f"{wrong}, events given up {unrecorded}; the worker saw the refusal: {refused_at_all}; "
        f"queue empty {recovered:.1f} s after {ended}"
    )
    report(FaultRow(fault, len(jobs), lost, twice, wrong, recovered))
    assert refused_at_all, "the refusal never reached the worker: the test proves nothing"
    assert unrecorded == 0, "the ledger gave events up"
    return lost, twice, wrong
