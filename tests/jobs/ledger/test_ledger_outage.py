"""The ledger writer after PostgreSQL closed its kept connection (a restart, an
idle timeout): the next batch health-checks the connection and reconnects, so a
job that ends then is recorded before its ack (a batch on the dead connection
used to be given up, and its jobs acked with no end recorded).

Run: bin/test --postgres tests/jobs/ledger/test_ledger_outage.py
"""

from __future__ import annotations

import subprocess
import time

import dramatiq
import pytest
from django.db import connection
from dramatiq.brokers.redis import RedisBroker

from jobs.ledger import writer as ledger
from jobs.models import Job
from tests.conftest import IDLE_POLL_MS, join

pytestmark = pytest.mark.django_db(transaction=True)
QUEUE = "pg-restart"
dramatiq.get_broker().declare_queue(QUEUE)


@dramatiq.actor(queue_name=QUEUE, max_retries=0)
def tiny_pg_restart(n: int) -> None:
    pass


def restart_postgres() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SHOW data_directory")
        (data,) = cursor.fetchone()
    connection.close()
    from project.postgres_server import _as_owner, find_pg_binary

    subprocess.run(
        [
            *_as_owner(),
            find_pg_binary("pg_ctl"),
            "-D",
            data,
            "-l",
            f"{data}/../postgres.log",
            "-m",
            "fast",
            "-w",
            "restart",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def wait_for(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_a_job_finished_after_a_postgres_restart_is_recorded_before_its_ack(
    broker: RedisBroker, settings
) -> None:
    if connection.vendor != "postgresql":
        pytest.skip(reason="PostgreSQL only: bin/test --postgres")
    settings.JOBS_LEDGER_FLUSH_MS = 200  # the shipped batching
    worker = dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=2)
    worker.start()
    try:
        # Given a worker whose ledger writer has written a job (it holds a connection)
        # (until one is recorded: after an earlier restart in this session, the
        # test process's own writer loses its first batch too -- the same bug)
        for _ in range(3):
            first = tiny_pg_restart.send(1)
            join(QUEUE)
            assert ledger.flush()
            connection.close()
            if Job.objects.filter(message_id=first.message_id, state="succeeded").exists():
                break
        else:
            raise AssertionError("no job recorded before the restart")

        # When PostgreSQL restarts (a minor upgrade, a failover, an OOM kill)
        restart_postgres()

        # and the next job runs and is acked
        second = tiny_pg_restart.send(2)
        join(QUEUE)
        assert ledger.flush()
        acked = not broker.client.hexists(
            f"{broker.namespace}:{QUEUE}.msgs", second.options["redis_message_id"]
        )
    finally:
        worker.stop()
        ledger.flush()

    # Then its end is in the ledger (it was acked, so nothing will run it again)
    row = Job.objects.filter(message_id=second.message_id).values("state").first()
    print(
        f"\nafter the restart: acked={acked}, ledger row={row}, "
        f"write_failures={ledger.stats.write_failures}"
    )
    assert acked
    assert row == {"state": "succeeded"}, f"acked but the ledger shows {row}"


def test_a_job_after_an_idle_spell_is_recorded_before_its_ack(
    broker: RedisBroker, settings
) -> None:
    """Same root cause without any outage: a server-side idle timeout shorter than
    the writer's 60 s (PostgreSQL's idle_session_timeout, PgBouncer's
    client_idle_timeout, a NAT or firewall) closes the kept connection between
    two quiet batches, and the next job's end is lost with its ack sent."""
    if connection.vendor != "postgresql":
        pytest.skip(reason="PostgreSQL only: bin/test --postgres")
    settings.JOBS_LEDGER_FLUSH_MS = 200
    with connection.cursor() as cursor:
        cursor.execute("ALTER ROLE CURRENT_USER SET idle_session_timeout = '3s'")
        # sessions opened from now on have it: end the ones open now
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    connection.close()
    worker = dramatiq.Worker(broker, worker_timeout=IDLE_POLL_MS, worker_threads=2)
    worker.start()
    try:
        for _ in range(3):  # until the writer holds a new connection (the first batch
            # on the terminated one is lost: the bug itself)
            first = tiny_pg_restart.send(1)
            join(QUEUE)
            assert ledger.flush()
            connection.close()
            if Job.objects.filter(message_id=first.message_id, state="succeeded").exists():
                break
        connection.close()
        time.sleep(5)  # a quiet spell longer than the idle timeout
        second = tiny_pg_restart.send(2)
        join(QUEUE)
        assert ledger.flush()
    finally:
        worker.stop()
        ledger.flush()
        connection.close()
        with connection.cursor() as cursor:
            cursor.execute("ALTER ROLE CURRENT_USER RESET idle_session_timeout")
        connection.close()
    row = Job.objects.filter(message_id=second.message_id).values("state").first()
    print(f"\nafter a 5 s idle spell (idle_session_timeout 3 s): ledger row={row}")
    assert row == {"state": "succeeded"}, f"acked but the ledger shows {row}"
